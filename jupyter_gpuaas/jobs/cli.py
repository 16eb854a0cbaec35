"""`jupyter-gpuaas jobs | logs ID`, and `submit NOTEBOOK.ipynb | SCRIPT.py`: batch jobs
from a shell, the same as `%gpu` from a notebook.

Jobs run in the user's Jupyter server (they outlive the shell), so these commands talk to
that server's `/gpuaas/jobs` routes: from a JupyterLab terminal the server's environment
already says where it is (GPUAAS_SERVER_URL, GPUAAS_SERVER_TOKEN); elsewhere set them.

`submit` itself stays client_cli's subcommand: with a path as its first argument it
submits a job through the server; without one it asks the gateway for GPUs directly.
`cancel ID` stays the gateway's too: a job's id is its request id, and the server ends a
job whose request its owner ended. Bad input exits 2, a refusal 1 with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (GPU counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def whole_number(text: str) -> int:
    """An argparse type: a whole number (priorities)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("jobs", help="my GPU jobs, from my Jupyter server")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_jobs)

    p = subparsers.add_parser("logs", help="a GPU job's log")
    p.add_argument("id", help="the job id")
    p.add_argument("--follow", "-f", action="store_true", help="until the job ends")
    p.add_argument("--tail", type=int, help="only the last N bytes")
    p.set_defaults(run=run_logs)


def add_submit_arguments(p: argparse.ArgumentParser) -> None:
    """The job half of client_cli's `submit`."""
    p.add_argument(
        "source",
        nargs="?",
        help="a notebook (.ipynb) or Python script (.py) to run as a job through your "
        "Jupyter server; without it, a raw GPU request to the gateway",
    )
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                   metavar=("NAME", "VALUE"), help="a papermill parameter (notebooks)")  # fmt: skip
    p.add_argument("--wait", action="store_true", help="wait for the job and print its log")


def _guard(fn: Any, args: argparse.Namespace) -> int:
    from .server_client import ServerError

    try:
        return int(fn(args))
    except ServerError as e:
        print(f"jupyter-gpuaas {args.command}: {e}", file=sys.stderr)
        return 1


def run_submit_job(args: argparse.Namespace) -> int:
    from .model import resolve_value
    from .server_client import ServerClient

    def go(args: argparse.Namespace) -> int:
        path = os.path.abspath(os.path.expanduser(args.source))
        if not os.path.isfile(path):
            print(f"jupyter-gpuaas submit: no such file: {args.source}", file=sys.stderr)
            return 1
        notebook = path.endswith(".ipynb")
        if not notebook and not path.endswith(".py"):
            print("jupyter-gpuaas submit: the job must be a notebook (.ipynb) or a Python "
                  f"script (.py), not {args.source}", file=sys.stderr)  # fmt: skip
            return 2
        if args.parameter and not notebook:
            print("jupyter-gpuaas submit: -p parameters need a notebook", file=sys.stderr)
            return 2
        spec: dict[str, Any] = {
            "kind": "notebook" if notebook else "script",
            "path": path,
            "gpus": args.gpus,
            "priority": args.priority,
        }
        if notebook:
            spec["parameters"] = {k: resolve_value(v) for k, v in args.parameter}
        else:
            spec["python"] = sys.executable
        for key in ("tenant", "flavor", "name"):
            if getattr(args, key, None):
                spec[key] = getattr(args, key)
        client = ServerClient.from_env()
        job = client.submit(spec)
        if args.json and not args.wait:
            print(json.dumps(job))
            return 0
        print(describe(job))
        if not args.wait:
            return 0
        for chunk in client.follow(job["id"]):
            print(chunk, end="", flush=True)
        while (job := client.job(job["id"]))["state"] in ("queued", "starting", "running"):
            time.sleep(0.5)
        print(json.dumps(job) if args.json else describe(job))
        return 0 if job["state"] == "succeeded" else 1

    return _guard(go, args)


def describe(job: dict[str, Any]) -> str:
    from .views import JobView

    return JobView.from_job(job).text()


def run_jobs(args: argparse.Namespace) -> int:
    def go(args: argparse.Namespace) -> int:
        from .server_client import ServerClient
        from .views import format_jobs

        jobs = ServerClient.from_env().jobs()
        print(json.dumps(jobs) if args.json else format_jobs(jobs))
        return 0

    return _guard(go, args)


def run_logs(args: argparse.Namespace) -> int:
    def go(args: argparse.Namespace) -> int:
        from .server_client import ServerClient

        client = ServerClient.from_env()
        if not args.follow:
            sys.stdout.write(client.logs(args.id, tail=args.tail))
            return 0
        try:
            for chunk in client.follow(args.id):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            print("\n(stopped following; the job goes on)", file=sys.stderr)
        return 0

    return _guard(go, args)
