"""Deadlines the core must act on: culls, expiries, leases, nodes joining or leaving.

A heap with lazy invalidation: setting a deadline again (or clearing it) leaves the old
heap entry behind, and it is skipped when it surfaces.
"""

from __future__ import annotations

import heapq
from typing import Final

# heapq's functions as C statics: compiled, a module attribute is looked up at each call.
heappop: Final = heapq.heappop
heappush: Final = heapq.heappush


class Timers:
    def __init__(self) -> None:
        # (time, push number, kind, key): flat, so a look at the top builds no tuple.
        self._heap: list[tuple[float, int, str, str]] = []
        # kind -> key (request id or node name) -> when: two string lookups, no tuple key
        # to build and hash for each of the million sets and clears of a month.
        self._due: dict[str, dict[str, float]] = {}
        self._seq = 0
        # The heap's top is known live (or the heap empty): nothing made it stale since it
        # was last looked at. The driver asks for the next deadline at every instant, and
        # most instants set or clear nothing.
        self._top_live = True

    def set(self, kind: str, key: str, t: float) -> None:
        due = self._due.get(kind)
        if due is None:
            due = self._due[kind] = {}
        elif key in due:
            self._top_live = False  # its old entry, stale now, may be the top
        due[key] = t
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, key))

    def clear(self, kind: str, key: str) -> None:
        due = self._due.get(kind)
        if due is not None and key in due:
            del due[key]
            self._top_live = False

    def get(self, kind: str, key: str) -> float | None:
        due = self._due.get(kind)
        return None if due is None else due.get(key)

    def _drop_stale(self) -> None:
        if self._top_live:
            return
        heap = self._heap
        while heap:
            top = heap[0]
            due = self._due.get(top[2])
            if due is not None and due.get(top[3]) == top[0]:
                break
            heappop(heap)
        self._top_live = True

    def next(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> tuple[float, str, str] | None:
        """The earliest deadline at or before `now`, removed; None if nothing is due."""
        self._drop_stale()
        if not self._heap or self._heap[0][0] > now:
            return None
        t, _, kind, key = heappop(self._heap)
        del self._due[kind][key]
        self._top_live = False
        return t, kind, key


# Timer kinds of the idle policy and the leases (the autoscaler has READY and SCALE_DOWN,
# grace.py EVICT).
CULL: Final = "cull"
WARN: Final = "cull_warning"
EXPIRE: Final = "expire"
LEASE: Final = "lease"
