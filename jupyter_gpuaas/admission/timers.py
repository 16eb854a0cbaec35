"""Deadlines the core must act on: culls, expiries, leases, nodes joining or leaving.

Deadlines fire in order of (time, order set). Setting a deadline again (or clearing it)
leaves the old entry behind, stale, and it is dropped when it is the earliest left (lazy
invalidation: an entry is live while its key's deadline still reads its time).

Most deadlines of a kind are set in time order (a cull at idle + a tenant's timeout, an
expiry at park + the reservation TTL), so entries go into lanes: a lane of one kind takes
an entry no earlier than its last, and is then a queue sorted by itself, appended and
popped at no cost. An entry that fits no lane goes into a heap. The earliest entry is the
least of the lanes' fronts and the heap's top. A month sets half a million culls and
clears most of them: in a heap each cost a push and a pop of log n comparisons.
"""

from __future__ import annotations

from typing import Final

from .heap import heappop, heappush

# (time, order set, kind, key): flat, so a look at the front builds no tuple.
_Entry = tuple[float, int, str, str]
# Lanes per kind, at most: a few timeouts per kind (the policy's and some tenants' own).
_LANES: Final = 4


class _Lane:
    """Entries of one kind in the order they were set, their times never decreasing."""

    def __init__(self) -> None:
        self.items: list[_Entry] = []
        self.head = 0  # items before it are gone
        self.last = 0.0  # the time of the last entry appended

    def drop_front(self) -> None:
        self.head += 1
        if self.head >= 256 and 2 * self.head >= len(self.items):
            del self.items[: self.head]  # the gone half, at once
            self.head = 0


class Timers:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._lanes: list[_Lane] = []
        self._by_kind: dict[str, list[_Lane]] = {}
        # kind -> key (request id or node name) -> when: two string lookups, no tuple key
        # to build and hash for each of the million sets and clears of a month.
        self._due: dict[str, dict[str, float]] = {}
        self._seq = 0
        # The earliest live entry, while `_known`: none (`_empty`), or its time, kind and key
        # and where it is (-1 the heap, else a lane's index). The driver asks for the next
        # deadline at every instant; most instants set or clear nothing, and what they
        # clear is rarely the earliest (every entry before it is gone).
        self._known = True
        self._empty = True
        self._next = 0.0
        self._next_kind = ""
        self._next_key = ""
        self._where = -1

    def set(self, kind: str, key: str, t: float) -> None:
        due = self._due.get(kind)
        if due is None:
            due = self._due[kind] = {}
        elif key in due and key == self._next_key and kind == self._next_kind:
            self._known = False  # its old entry, stale now, was the earliest
        due[key] = t
        self._seq += 1
        entry = (t, self._seq, kind, key)
        lanes = self._by_kind.get(kind)
        if lanes is None:
            lanes = self._by_kind[kind] = []
        for lane in lanes:
            if t >= lane.last:
                lane.items.append(entry)
                lane.last = t
                break
        else:
            if len(lanes) < _LANES:
                lane = _Lane()
                lane.items.append(entry)
                lane.last = t
                lanes.append(lane)
                self._lanes.append(lane)
            else:
                heappush(self._heap, entry)
        if self._known and (self._empty or t < self._next):
            self._known = False  # the earliest now (set later, it goes after an equal time)

    def clear(self, kind: str, key: str) -> None:
        due = self._due.get(kind)
        if due is not None and key in due:
            del due[key]
            if key == self._next_key and kind == self._next_kind:
                self._known = False  # the earliest is stale now

    def get(self, kind: str, key: str) -> float | None:
        due = self._due.get(kind)
        return None if due is None else due.get(key)

    def _settle(self) -> None:
        """Find the earliest live entry, dropping stale ones only while they are the
        earliest (as a single heap would: a stale entry may come alive again when its
        key is set to the same time). Called only when the earliest is not known: most
        instants of a replay set or clear nothing, and there the look costs no call."""
        heap = self._heap
        lanes = self._lanes
        while True:
            where = -2
            best_t = 0.0
            best_seq = 0
            if heap:
                top = heap[0]
                where, best_t, best_seq = -1, top[0], top[1]
            for i in range(len(lanes)):
                lane = lanes[i]
                if lane.head < len(lane.items):
                    front = lane.items[lane.head]
                    t = front[0]
                    if where == -2 or t < best_t or (t == best_t and front[1] < best_seq):
                        where, best_t, best_seq = i, t, front[1]
            if where == -2:
                self._empty = True
                self._next_kind = self._next_key = ""
                break
            e = heap[0] if where < 0 else lanes[where].items[lanes[where].head]
            due = self._due.get(e[2])
            if due is not None and due.get(e[3]) == e[0]:
                self._empty = False
                self._next = e[0]
                self._next_kind = e[2]
                self._next_key = e[3]
                self._where = where
                break
            if where < 0:
                heappop(heap)
            else:
                lanes[where].drop_front()
        self._known = True

    def next(self) -> float | None:
        if not self._known:
            self._settle()
        return None if self._empty else self._next

    def pop_due(self, now: float) -> tuple[float, str, str] | None:
        """The earliest deadline at or before `now`, removed; None if nothing is due."""
        if not self._known:
            self._settle()
        if self._empty or self._next > now:
            return None
        if self._where < 0:
            t, _, kind, key = heappop(self._heap)
        else:
            lane = self._lanes[self._where]
            t, _, kind, key = lane.items[lane.head]
            lane.drop_front()
        del self._due[kind][key]
        self._known = False
        return t, kind, key


# Timer kinds of the idle policy and the leases (the autoscaler has READY and SCALE_DOWN,
# grace.py EVICT).
CULL: Final = "cull"
WARN: Final = "cull_warning"
EXPIRE: Final = "expire"
LEASE: Final = "lease"
