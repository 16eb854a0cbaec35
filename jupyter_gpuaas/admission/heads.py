"""The nominated heads of one admission cycle, and which of them goes first.

A cycle admits one head at a time and asks for the best again, so with thousands of tenants
the choice must not scan them all: of 2,000 tenants most have nothing to offer, and on a
busy instant a thousand heads may wait at once. Admission keys are unique (they end in the
request's arrival number), so the best is the least key: a heap finds it. A replaced head
stays in the heap, stale, until it reaches the top, where it is dropped.

Fair sharing in a cohort tree orders heads by Kueue's tournament, not by key alone: there
the caller's `tournament` picks the best of all the heads at once (a bracket, fairshare.py).

With `one_head_per_cycle` (Policy), one turn per tenant per cycle, as in Kueue, whose
cycle takes one head from each
ClusterQueue (`Heads` in its queue manager) and admits those that fit in order: a tenant
whose head went in (or issued its preemption) `had_turn`, and its next head waits for the
next cycle (`next_cycle`) behind the heads of the other tenants of this one, however its
key ranks. So when room for two frees up, the second of one tenant's waiting requests
does not go before another tenant's first.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from .heap import heapify, heappop, heappush
from .nominate import Entry


class Heads:
    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}  # tenant -> its nominated head (tenants with one)
        # (key, push number, tenant, entry): the push number breaks the tie of a head
        # nominated again with the same key, so entries are never compared.
        self._heap: list[tuple[tuple[Any, ...], int, str, Entry]] = []
        self._pushed = 0
        # The tenants that had their turn in the cycle under way, and their heads' heap
        # items taken out of the heap meanwhile (put back by `next_cycle`).
        self._turned: set[str] = set()
        # Tenants that sit out cycles before their head may go: {tenant: how many}.
        self._waits: dict[str, int] = {}
        self._held: list[tuple[tuple[Any, ...], int, str, Entry]] = []

    def set(self, tenant: str, entry: Entry | None) -> None:
        if entry is None:
            self.entries.pop(tenant, None)
            return
        self.entries[tenant] = entry
        self._pushed += 1
        heappush(self._heap, (entry.key, self._pushed, tenant, entry))
        if len(self._heap) > 4 * len(self.entries) + 1024:
            # Mostly stale: rebuild, so memory follows the live heads, not the history.
            self._heap = [x for x in self._heap if self.entries.get(x[2]) is x[3]]
            heapify(self._heap)

    def best(self, tournament: Callable[[Collection[Entry]], Entry | None] | None) -> Entry | None:
        """The head that goes first in this cycle: the least key, or the `tournament`'s
        pick when given, among the tenants that have not had their turn."""
        turned = self._turned
        waits = self._waits
        if tournament is not None:
            if not turned and not waits:
                return tournament(self.entries.values()) if self.entries else None
            may = [e for t, e in self.entries.items() if t not in turned and t not in waits]
            return tournament(may) if may else None
        heap = self._heap
        entries = self.entries
        while heap:
            top = heap[0]
            if entries.get(top[2]) is top[3]:
                if top[2] not in turned and top[2] not in waits:
                    return top[3]
                self._held.append(top)
            heappop(heap)
        return None

    def had_turn(self, tenant: str) -> None:
        """The tenant's head went in (or issued its preemption, or was found unable to go
        at its turn) in this cycle."""
        self._turned.add(tenant)

    def wait(self, tenant: str, cycles: int) -> None:
        """The tenant's nominated head may go only after `cycles` more cycles, after
        its turn in this one if it had it (its queue's requests ahead of it that cannot
        go each take a cycle in Kueue)."""
        self._waits[tenant] = self._waits.get(tenant, 0) + cycles

    def next_cycle(self) -> bool:
        """End the cycle: every tenant may go again, but those that still sit out
        cycles. False when no tenant had a turn or sits out (the cycle admitted nothing,
        so another would not either)."""
        turned = self._turned
        if not turned and not self._waits:
            return False
        waits = self._waits
        for t in list(waits):
            if t in turned:
                continue  # its wait starts after the turn it had
            if waits[t] > 1:
                waits[t] -= 1
            else:
                del waits[t]
        turned.clear()
        for item in self._held:
            if self.entries.get(item[2]) is item[3]:
                heappush(self._heap, item)
        self._held.clear()
        return True
