"""The `jupyter-gpuaas gateway` subcommand's registration, apart from the service itself.

Every `jupyter-gpuaas` command registers all subcommands before it parses its arguments;
importing the gateway's Application (app.py: traitlets, ssl, asyncio, the store) for that
cost every other command, `simulate` included, about 45 ms. The service is imported when
the subcommand runs.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    # The traitlets Application parses its own flags: hand it everything after `gateway`.
    p = subparsers.add_parser(
        "gateway",
        help="run the gateway service (standalone or as a JupyterHub service)",
        add_help=False,
        prefix_chars="\x00",
    )
    p.add_argument("argv", nargs="*")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .app import main

    return main(list(args.argv))
