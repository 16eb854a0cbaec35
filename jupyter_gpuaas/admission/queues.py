"""A tenant's queue, split into buckets of requests that fit or fail alike.

Two queued requests of one tenant with the same GPU count and the same flavor choice fit
the quota and the nodes in exactly the same way at any instant. So the queue keeps them in
buckets by (pinned flavor, gpus), each in queue order, and an admission cycle tries only
each bucket's head: if the head does not fit, nobody behind it in that bucket does. The
cost of a cycle is then in the number of buckets (a few), never in the number of queued
requests.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterator
from dataclasses import dataclass

from .model import Request

BucketKey = tuple[str | None, int]  # (pinned flavor or None, gpus)
OrderKey = tuple[int, float, int]  # (-priority, queue time, arrival)


def order_key(req: Request) -> OrderKey:
    """Higher priority first, then earlier (re)queue time, then arrival."""
    return (-req.priority, req.queue_time, req.seq)


# An entry: the order key's fields, flat (one pointer less to follow per comparison),
# then the request. Unique before the request (seq is).
_Slot = tuple[int, float, int, Request]


@dataclass(init=False)  # a written __init__: mypyc compiles it (see model.Request)
class _Level:
    """A bucket's entries of one priority, in queue order from `start` (those before it
    have left). Requests arrive in queue order (a queue time is the time it is queued at,
    and the arrival number grows), so an entry is appended and the head taken from the
    front, at no cost in the length: only a job requeued by its older submit time is
    inserted in its place."""

    slots: list[_Slot]
    start: int
    # Entries that left from behind the front (at most): while 0, the front is live
    # without a look at the queue's index.
    stale: int
    # The index of a front found live in the queue's index. It stays live until `start`
    # moves: a request that leaves from the front moves it (`remove`). So the front is
    # looked up once, not at every look at the head (at 100,000 queued each lookup is a
    # cache miss, and some stale entry is nearly always behind a front).
    checked: int

    def __init__(self) -> None:
        self.slots = []
        self.start = 0
        self.stale = 0
        self.checked = -1


@dataclass(init=False)  # a written __init__: mypyc compiles it (see model.Request)
class Bucket:
    """A bucket's requests by priority: the head is the front of the highest level.
    (A heap of them all was O(log n) per admission, a cache miss per level at 100,000
    queued; the levels are few.)"""

    key: BucketKey
    levels: dict[int, _Level]  # by priority
    prios: list[int]  # the levels' priorities, highest first
    top: _Level | None  # the level of prios[0]
    count: int
    # Set when the head failed to fit or preempt; cleared when room frees up for it.
    inadmissible: bool

    def __init__(self, key: BucketKey) -> None:
        self.key = key
        self.levels = {}
        self.prios = []
        self.top = None
        self.count = 0
        self.inadmissible = False

    def front(self) -> _Slot:
        """The head's entry: the bucket has one, and stale entries before it were dropped
        (`TenantQueue._live`)."""
        level = self.top
        assert level is not None
        return level.slots[level.start]


class TenantQueue:
    def __init__(self) -> None:
        self.buckets: dict[BucketKey, Bucket] = {}
        # Each queued request's live entry. An entry in a level that is not the one here
        # (the request left, or was queued again) is stale and dropped at the front.
        # One dict for membership, order and the request: a queue of 100,000 is mostly
        # cache misses, and each dict touched on a submit is one more.
        self._slot: dict[str, _Slot] = {}
        # Parked requests that are busy again and wait for devices: served before anyone.
        self.resuming: dict[str, Request] = {}

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, rid: str) -> bool:
        return rid in self._slot

    def push(self, req: Request) -> Bucket:
        bkey: BucketKey = (req.flavor, req.gpus)
        bucket = self.buckets.get(bkey)
        if bucket is None:
            bucket = self.buckets[bkey] = Bucket(bkey)
        prio = req.priority
        level = bucket.levels.get(prio)
        if level is None:
            level = bucket.levels[prio] = _Level()
            prios = bucket.prios
            i = 0
            while i < len(prios) and prios[i] > prio:
                i += 1
            prios.insert(i, prio)
            if i == 0:
                bucket.top = level
        slot = (-prio, req.queue_time, req.seq, req)
        slots = level.slots
        if len(slots) == level.start or _before(slots[-1], slot):
            slots.append(slot)
        else:
            insort(slots, slot, level.start)  # queued again by an earlier time
        bucket.count += 1
        self._slot[req.id] = slot
        return bucket

    def remove(self, rid: str) -> Request | None:
        """Take a request out. Its entry is dropped now if it heads its level, else when
        it reaches the front: the removal pays for its own work, not the next cycle that
        looks at the head."""
        slot = self._slot.pop(rid, None)
        if slot is None:
            return None
        req = slot[3]
        bkey = (req.flavor, req.gpus)
        bucket = self.buckets[bkey]
        bucket.count -= 1
        if bucket.count == 0:
            del self.buckets[bkey]
            return req
        level = bucket.levels[-slot[0]]
        if level.start < len(level.slots) and _same(level.slots[level.start], slot):
            level.start += 1  # the head leaves (an admission): no stale entry
            if level is bucket.top:
                self._live(bucket)
        else:
            level.stale += 1
        return req

    def _live(self, bucket: Bucket) -> bool:
        """Drop stale entries from the front of the top level, and empty levels; True
        when the bucket has a head."""
        slots_of = self._slot
        while True:
            level = bucket.top
            if level is None:
                return False
            slots = level.slots
            while level.stale and level.start < len(slots) and level.start != level.checked:
                front = slots[level.start]
                live = slots_of.get(front[3].id)
                if live is not None and _same(live, front):
                    level.checked = level.start
                    break
                level.start += 1
                level.stale -= 1
            if level.start < len(slots):
                if level.start > 64 and 2 * level.start > len(slots):
                    del slots[: level.start]  # (amortized: the front was passed over)
                    level.checked = 0 if level.checked == level.start else -1
                    level.start = 0
                return True
            del bucket.levels[bucket.prios.pop(0)]
            bucket.top = bucket.levels[bucket.prios[0]] if bucket.prios else None

    def head(self, bucket: Bucket) -> Request | None:
        return bucket.front()[3] if self._live(bucket) else None

    def levels_ahead(self, bucket: Bucket, slot: _Slot) -> int:
        """How many of `bucket`'s priorities have a request before the entry `slot` in
        queue order."""
        n = 0
        live = self._slot
        for level in bucket.levels.values():
            slots = level.slots
            for i in range(level.start, len(slots)):
                s = slots[i]
                if not _before(s, slot):
                    break
                found = live.get(s[3].id)
                if found is not None and _same(found, s):
                    n += 1
                    break
        return n

    def heads(self, include_inadmissible: bool = False) -> list[Bucket]:
        """The buckets with a head, in queue order of their heads (each bucket's head is
        `bucket.front()[3]`, live: stale entries before it were dropped)."""
        out: list[Bucket] = []
        for bucket in self.buckets.values():
            if bucket.inadmissible and not include_inadmissible:
                continue
            if self._live(bucket):
                out.append(bucket)
        # Ordered by hand, building no key: a tenant has a few buckets, and compiled,
        # list.sort calls its key through the interpreter's call protocol, and a key read
        # off an entry is a new tuple each time (2% of a month's samples, when it did).
        n = len(out)
        if n == 2:
            if _before(out[1].front(), out[0].front()):
                out.reverse()
        elif n > 2:
            # Insertion sort, entries read in place (compiled, an entry kept in a list is
            # boxed again); they are unique, so any sort gives this order.
            for i in range(1, n):
                bucket = out[i]
                entry = bucket.front()  # (once, not at each comparison)
                j = i - 1
                while j >= 0 and _before(entry, out[j].front()):
                    out[j + 1] = out[j]
                    j -= 1
                out[j + 1] = bucket
        return out

    def first(self) -> Request | None:
        heads = self.heads(include_inadmissible=True)
        return heads[0].front()[3] if heads else None

    def clear_marks(self) -> None:
        for bucket in self.buckets.values():
            bucket.inadmissible = False

    def requests(self) -> Iterator[Request]:
        return (slot[3] for slot in self._slot.values())

    def ahead_of(self, req: Request) -> int:
        """How many queued requests of this tenant go before `req` (a scan: for display)."""
        mine = order_key(req)
        return sum(1 for slot in self._slot.values() if slot[:3] < mine)


def _before(a: _Slot, b: _Slot) -> bool:
    """Does entry `a` go before `b` in queue order? (Their order keys differ: unique.)"""
    if a[0] != b[0]:
        return a[0] < b[0]
    if a[1] != b[1]:
        return a[1] < b[1]
    return a[2] < b[2]


def _same(a: _Slot, b: _Slot) -> bool:
    """Is `a` the entry `b` (its request's live one, when `a` is that)? The order key decides:
    it is unique to one request. Field by field, because mypyc keeps these tuples unboxed,
    and `a == b` would box them again to compare them generically."""
    return a[2] == b[2] and a[1] == b[1] and a[0] == b[0]
