"""What the fault tests share besides fixtures: freezing process trees, PostgreSQL's postmaster.

A module of its own (not conftest.py): when several test directories run together,
`from conftest import X` finds whichever conftest was imported first (tests/helpers.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any


class Freezer:
    """SIGSTOP and SIGCONT of process trees; everything still stopped is resumed at the end."""

    def __init__(self) -> None:
        self.stopped: list[int] = []

    @staticmethod
    def tree(pid: int) -> list[int]:
        """`pid` and its descendants (PostgreSQL: the postmaster and its backends)."""
        out = [pid]
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            out += Freezer.tree(int(child))
        return out

    def stop(self, pid: int) -> None:
        pids = self.tree(pid)
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        self.stopped += pids

    def resume(self) -> None:
        pids, self.stopped = self.stopped, []
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass


def postmaster_pid(server: Any) -> int:
    return int((Path(server.data) / "postmaster.pid").read_text().split()[0])
