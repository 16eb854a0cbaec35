"""Who decides: the engine the arbiter hands requests to (`Arbiter.engine`).

The arbiter drives; the engine decides. By default that is the admission core itself
(`AdmissionCore` has exactly these methods); with `--admission kueue` it is
`KueueEngine` (kueue_engine.py), for which Kueue decides and the gateway only records and
shows its decisions. Everything else (the store first, then the announcements; the views,
the metrics) is the arbiter's and the same for both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from jupyter_gpuaas.admission.model import Decision, Request
from jupyter_gpuaas.admission.views import Position


class Engine(Protocol):
    """What the arbiter asks of whoever decides (a subset of AdmissionCore's face)."""

    def submit(self, req: Request, now: float) -> list[Decision]: ...

    def cancel(self, rid: str, now: float, reason: str = "") -> list[Decision]: ...

    def finish(self, rid: str, now: float, reason: str = "") -> list[Decision]: ...

    def heartbeat(self, rid: str, now: float, busy: bool | None = None) -> list[Decision]: ...

    def restore(self, req: Request, now: float) -> list[Decision]: ...

    def step(self, now: float) -> list[Decision]: ...

    def next_deadline(self) -> float | None: ...

    def position(self, rid: str) -> Position | None: ...

    def waiting_for(self, rid: str) -> tuple[str, dict[str, Any]] | None: ...

    def reclaiming(self, rid: str) -> list[Request]: ...

    def admitted(self) -> Iterable[Request]: ...
