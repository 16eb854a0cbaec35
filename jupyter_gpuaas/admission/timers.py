"""Deadlines the core must act on: culls, expiries, leases, nodes joining or leaving.

A heap with lazy invalidation: setting a deadline again (or clearing it) leaves the old
heap entry behind, and it is skipped when it surfaces.
"""

from __future__ import annotations

import heapq

TimerKey = tuple[str, str]  # (kind, request id or node name)


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerKey]] = []
        self._due: dict[TimerKey, float] = {}
        self._seq = 0

    def set(self, kind: str, key: str, t: float) -> None:
        self._due[(kind, key)] = t
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, (kind, key)))

    def clear(self, kind: str, key: str) -> None:
        self._due.pop((kind, key), None)

    def get(self, kind: str, key: str) -> float | None:
        return self._due.get((kind, key))

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)

    def next(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> tuple[float, str, str] | None:
        """The earliest deadline at or before `now`, removed; None if nothing is due."""
        self._drop_stale()
        if not self._heap or self._heap[0][0] > now:
            return None
        t, _, key = heapq.heappop(self._heap)
        del self._due[key]
        return t, key[0], key[1]


# Timer kinds of the idle policy and the leases (the autoscaler has READY and SCALE_DOWN,
# grace.py EVICT).
CULL, WARN, EXPIRE, LEASE = "cull", "cull_warning", "expire", "lease"
