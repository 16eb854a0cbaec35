"""`%load_ext jupyter_gpuaas`: the `%gpu` line magic and the `%%gpu_job` cell magic.

    %gpu status                       my requests, my tenants' quota and usage, devices
    %gpu submit NB.ipynb [--gpus 1] [--tenant T] [--flavor F] [--priority P] [-p NAME VALUE]...
    %gpu jobs                         this server's jobs
    %gpu logs ID [--follow]           a job's log (--follow: until it ends)
    %gpu cancel ID                    dequeue, or stop and free the GPUs

    %%gpu_job [--gpus 1] [--tenant T] [--flavor F] [--name NAME]
    <the cell's code runs as a script on the granted GPUs, in the notebook's directory>

Everything goes to this kernel's Jupyter server (`server_client.py` says how it is found
and why the server and not the gateway): jobs run there, so they outlive this kernel.
`submit` and `%%gpu_job` return a `GpuJob`: displayed, it is a live widget in JupyterLab
(plain text elsewhere); `job.wait()` blocks until it ends.

`%gpu?` and `%%gpu_job?` show the usage. A bad argument, or a refusal by the server or the
gateway, raises IPython's `UsageError` with the sentence: the cell fails, so Run All,
papermill and nbclient stop there instead of running the next cells on a job that was
never submitted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser

from jupyter_gpuaas.jobs.cli import positive_int, whole_number
from jupyter_gpuaas.jobs.model import ENDED, resolve_value
from jupyter_gpuaas.jobs.server_client import ServerClient, ServerError
from jupyter_gpuaas.jobs.views import JobView, StatusView, format_jobs

COMMANDS = ("status", "submit", "jobs", "logs", "cancel")


class _HelpShown(Exception):
    """`-h` of a subcommand: its help is printed, nothing else happens."""


class _Parser(MagicArgumentParser):
    """IPython's magic parser: a bad argument raises `UsageError`, which IPython shows as
    one red line and which stops Run All, papermill and nbclient (a printed error and a
    `None` result would let the next cells run on). The sentence comes first, the usage
    (as a person types it, `%gpu submit ...`) on the next line."""

    def error(self, message: str) -> Any:
        formatter = argparse.HelpFormatter(prog=self.prog)
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups, "")
        raise UsageError(f"%{self.prog}: {message}\nusage: %{formatter.format_help().strip()}")

    def parse(self, line: str) -> argparse.Namespace:
        """The magic's line split as IPython splits it (quotes kept together)."""
        args: argparse.Namespace = self.parse_argstring(line)  # type: ignore[no-untyped-call]
        return args

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        if status:
            self.error(message or "")
        raise _HelpShown


def _request_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default=1, type=positive_int, help="how many GPUs (default 1)")
    p.add_argument("--tenant", help="the tenant (team) to charge (default: yours)")
    p.add_argument("--flavor", help="a GPU flavor, e.g. a100 (default: any of the tenant's)")
    p.add_argument("--priority", type=whole_number, default=0, help="higher runs first in a tenant")
    p.add_argument("--name", help="a name to recognise the job by")
    p.add_argument("--wait", action="store_true", help="block until the job ends")


def _add_commands(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}",
                           parser_class=_Parser, required=True)  # fmt: skip
    s = sub.add_parser("status", help="my requests, my tenants' quota and usage, devices",
                       add_help=True)  # fmt: skip
    s.add_argument("--text", action="store_true", help="plain text, not a live widget")
    s.add_argument("--every", type=_seconds, default=5.0, metavar="SECONDS",
                   help="seconds between refreshes of the live view (default 5)")  # fmt: skip
    s = sub.add_parser("submit", help="run a notebook as a GPU job (papermill parameters)",
                       add_help=True)  # fmt: skip
    s.add_argument("notebook", help="the notebook (.ipynb) to run")
    _request_options(s)
    s.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                   metavar=("NAME", "VALUE"), help="a papermill parameter")  # fmt: skip
    sub.add_parser("jobs", help="this server's GPU jobs", add_help=True)
    s = sub.add_parser("logs", help="a job's log", add_help=True)
    s.add_argument("id")
    s.add_argument("--follow", "-f", action="store_true", help="until the job ends")
    s.add_argument("--tail", type=positive_int, help="only the last N bytes")
    s = sub.add_parser("cancel", help="cancel a job (dequeue, or stop and free its GPUs)",
                       add_help=True)  # fmt: skip
    s.add_argument("id")
    # `%gpu?` shows the magic's docstring, which magic_arguments makes the parser's help:
    # the epilog puts every subcommand's own usage in it, not only their names.
    usages = []
    for name in COMMANDS:
        formatter = argparse.HelpFormatter(prog=sub.choices[name].prog, width=90)
        command = sub.choices[name]
        formatter.add_usage(command.usage, command._actions, [], "")
        usages.append("  %" + formatter.format_help().strip())
    p.epilog = "subcommand usage:\n\n" + "\n".join(usages)


def line_parser() -> _Parser:
    """`%gpu`'s parser (the one GpuMagics.gpu parses with)."""
    return _PARSERS["gpu"]


def cell_parser() -> _Parser:
    """`%%gpu_job`'s parser."""
    return _PARSERS["gpu_job"]


def _rich_frontend() -> bool:
    """A kernel talking to a frontend that can show widgets (not a terminal IPython)."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is None or getattr(ip, "kernel", None) is None:
            return False
        import ipywidgets  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


class GpuJob:
    """A handle on one job of this server. Displayed: a live widget (or a text line)."""

    def __init__(self, client: ServerClient, data: dict[str, Any]) -> None:
        self.client = client
        self.data = data

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def state(self) -> str:
        return str(self.data["state"])

    def refresh(self) -> GpuJob:
        self.data = self.client.job(self.id)
        return self

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> GpuJob:
        """Block until the job ends (or `timeout` seconds: TimeoutError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.refresh().state not in ENDED:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"GPU job {self.id} still {self.state} after {timeout} s")
            time.sleep(interval)
        return self

    def cancel(self) -> GpuJob:
        self.data = self.client.cancel(self.id)
        return self

    def logs(self, tail: int | None = None) -> str:
        return self.client.logs(self.id, tail=tail)

    def __repr__(self) -> str:
        return f"GpuJob({self.id!r}, state={self.state!r})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(JobView.from_job(self.data).text())

    def _ipython_display_(self) -> None:
        if _rich_frontend():
            from IPython.display import display

            from jupyter_gpuaas.notebook.widgets import JobWidget

            display(JobWidget(self.client, self.data))  # type: ignore[no-untyped-call]
        else:
            print(JobView.from_job(self.data).text())


@magics_class
class GpuMagics(Magics):
    @line_magic("gpu")  # type: ignore[arg-type]
    def gpu(self, line: str) -> Any:
        """GPU jobs and status through the gpuaas gateway."""
        if line.strip() in ("", "help", "-h", "--help"):
            print(line_parser().format_help())
            return None
        try:
            args = line_parser().parse(line)
        except ValueError as e:  # unbalanced quotes
            raise UsageError(f"%gpu: {e}") from None
        except _HelpShown:
            return None
        try:
            return getattr(self, f"_{args.command}")(args)
        except ServerError as e:
            raise UsageError(f"%gpu {args.command}: {e}") from None

    @cell_magic("gpu_job")  # type: ignore[arg-type]
    def gpu_job(self, line: str, cell: str) -> Any:
        """Run this cell's code as a GPU job, in the notebook's directory, on the granted
        GPUs; it returns the job (displayed: a live widget)."""
        try:
            args = cell_parser().parse(line)
        except ValueError as e:
            raise UsageError(f"%%gpu_job: {e}") from None
        except _HelpShown:
            return None
        spec = {
            "kind": "cell",
            "code": cell,
            "cwd": os.getcwd(),
            "python": sys.executable,
            **_request(args),
        }
        try:
            return _submit(spec, args.wait)
        except ServerError as e:
            raise UsageError(f"%%gpu_job: {e}") from None

    # ------------------------------------------------------------------ subcommands

    def _status(self, args: argparse.Namespace) -> None:
        client = ServerClient.from_env()
        if _rich_frontend() and not args.text:
            from IPython.display import display

            from jupyter_gpuaas.notebook.widgets import StatusWidget

            display(StatusWidget(client, interval=args.every))  # type: ignore[no-untyped-call]
            return
        print(StatusView.from_status(client.status()).text())

    def _submit(self, args: argparse.Namespace) -> GpuJob | None:
        path = os.path.abspath(os.path.expanduser(args.notebook))
        spec = {
            "kind": "notebook",
            "path": path,
            "parameters": {name: resolve_value(value) for name, value in args.parameter},
            **_request(args),
        }
        return _submit(spec, args.wait)

    def _jobs(self, args: argparse.Namespace) -> None:
        jobs = ServerClient.from_env().jobs()
        print(format_jobs(jobs))

    def _logs(self, args: argparse.Namespace) -> None:
        client = ServerClient.from_env()
        if not args.follow:
            print(client.logs(args.id, tail=args.tail), end="")
            return
        try:
            for chunk in client.follow(args.id):
                print(chunk, end="", flush=True)
        except KeyboardInterrupt:
            print("\n(stopped following; the job goes on)")

    def _cancel(self, args: argparse.Namespace) -> None:
        job = ServerClient.from_env().cancel(args.id)
        print(JobView.from_job(job).text())


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} s is not between 0.1 s and an hour")
    return value


def _request(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"gpus": args.gpus, "priority": args.priority}
    for key in ("tenant", "flavor", "name"):
        if getattr(args, key):
            out[key] = getattr(args, key)
    return out


def _submit(spec: dict[str, Any], wait: bool) -> GpuJob:
    client = ServerClient.from_env()
    job = GpuJob(client, client.submit(spec))
    return job.wait() if wait else job


def _magic_parser(magic: Any, prog: str, build: Any) -> _Parser:
    """The magic's parser, and its help as the magic's docstring, so that `%gpu?` and
    `%%gpu_job?` show the usage (what IPython's magic_arguments decorators do, with the
    parser class above)."""
    parser = _Parser(prog=prog, description=magic.__doc__)  # type: ignore[no-untyped-call]
    build(parser)
    magic.__doc__ = parser.format_help()
    return parser


_PARSERS = {
    "gpu": _magic_parser(GpuMagics.gpu, "gpu", _add_commands),
    "gpu_job": _magic_parser(GpuMagics.gpu_job, "%gpu_job", _request_options),
}


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(GpuMagics)
