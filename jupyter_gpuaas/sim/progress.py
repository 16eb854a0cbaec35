"""A long `simulate`'s progress, on stderr: how much of the virtual clock has run.

On a terminal, one line redrawn in place (at most five times a second) and erased at the
end, so the report on stdout reads as without it; elsewhere (`--progress` into a pipe or a
log), a line every few seconds and a last one when the clock stops. Never on stdout, so
`--json` stays one JSON document. Fed by the report's `Tally` every few thousand
decisions (`Tally(progress=...)`), so a run without it costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TextIO

from jupyter_gpuaas.sim.scenario import ScenarioRequest
from jupyter_gpuaas.words import format_duration

#: Seconds between two drawings: on a terminal, and into a pipe or a file.
TERMINAL_EVERY = 0.2
LOG_EVERY = 5.0


def expected_end(until: float | None, requests: Sequence[ScenarioRequest]) -> float:
    """Where the clock will stop: `until`, else the last request's submit plus duration
    (a guess: a request that waits ends later)."""
    if until is not None and until != float("inf"):
        return until
    return max((r.submit + r.duration for r in requests), default=0.0)


class Progress:
    """Call it with the virtual clock's time; `finish` once the clock has stopped."""

    def __init__(
        self,
        end: float,
        stream: TextIO,
        *,
        terminal: bool,
        label: str = "simulate",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.end = end
        self.label = label
        self.stream = stream
        self.terminal = terminal
        self.clock = clock
        self.started = clock()
        self._next = self.started  # the first call draws
        self._every = TERMINAL_EVERY if terminal else LOG_EVERY

    def line(self, t: float, done: bool = False) -> str:
        elapsed = format_duration(self.clock() - self.started)
        if done:
            return f"{self.label}: {format_duration(t)} simulated, done in {elapsed}"
        share = min(99, int(100 * t / self.end)) if self.end > 0 else 0
        return (
            f"{self.label}: {format_duration(t)} of {format_duration(self.end)} simulated "
            f"({share}%), {elapsed} so far"
        )

    def __call__(self, t: float) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self._every
        self._write(self.line(t))

    def finish(self, t: float) -> None:
        if self.terminal:
            self.stream.write("\r\x1b[K")  # erase the line: the report follows cleanly
            self.stream.flush()
        else:
            self._write(self.line(t, done=True))

    def _write(self, text: str) -> None:
        if self.terminal:
            self.stream.write(f"\r{text}\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
