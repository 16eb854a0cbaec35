"""`jupyter-gpuaas`: one console script with a subcommand per feature.

Each subcommand lives in its own module with `add_parser(subparsers)` (which registers the
subcommand and sets `run` as its handler through `set_defaults(run=...)`) and
`run(args) -> int`. This file only lists the modules, so the gateway, client and demo
commands can be added without touching each other; modules should import their heavy
dependencies inside `run`, so `jupyter-gpuaas simulate` does not pay for tornado.

`jupyter gpuaas ...` works too: Jupyter's launcher runs `jupyter-gpuaas` from PATH.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

PROG = "jupyter-gpuaas"

#: Modules providing subcommands, in the order `--help` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "jupyter_gpuaas.sim.cli",
    "jupyter_gpuaas.server.kernelspec_cli",
    "jupyter_gpuaas.gateway.cli",
    "jupyter_gpuaas.gateway.history",
    "jupyter_gpuaas.gateway.advice",
    "jupyter_gpuaas.devices.cli",
    "jupyter_gpuaas.client_cli",
    "jupyter_gpuaas.jobs.cli",
    "jupyter_gpuaas.hub.demo",
    "jupyter_gpuaas.kubernetes.cli",
    "jupyter_gpuaas.kubernetes.kueue_cli",
)


def core_kind() -> str:
    """Which admission core this installation runs: the modules compiled with mypyc (a
    platform wheel, or `make core` in a checkout), or their pure-Python source (the same
    decisions, several times slower)."""
    import jupyter_gpuaas.admission.core as core

    if core.__file__ is not None and not core.__file__.endswith(".py"):
        return "admission core: compiled with mypyc"
    return "admission core: pure Python, not compiled (slower, same decisions)"


class _Version(argparse.Action):
    """--version: the version and which core runs (imported only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from jupyter_gpuaas._version import __version__

        print(f"{PROG} {__version__}\n{core_kind()}")  # on stdout, as argparse's version
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A notebook-centric GPU gateway for JupyterHub.",
    )
    parser.add_argument("--version", action=_Version)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help()
        return 2
    result: int = run(args)
    if getattr(args, "exit_at_once", False) and argv is None:
        # A batch command run from the shell (`simulate` over a month builds millions of
        # objects): hand the memory back to the OS at once instead of freeing the objects
        # one by one, which took 1.6 s of a 40 s run. Only when we own the process (no
        # argv given: the console script), never for a caller that passed its own argv.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(result)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
