"""A tenant's queue, split into buckets of requests that fit or fail alike.

Two queued requests of one tenant with the same GPU count and the same flavor choice fit
the quota and the nodes in exactly the same way at any instant. So the queue keeps one
priority heap per (pinned flavor, gpus) bucket, and an admission cycle tries only each
bucket's head: if the head does not fit, nobody behind it in that bucket does. The cost of
a cycle is then in the number of buckets (a few), never in the number of queued requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .heap import heappop, heappush
from .model import Request

BucketKey = tuple[str | None, int]  # (pinned flavor or None, gpus)
OrderKey = tuple[int, float, int]  # (-priority, queue time, arrival)


def order_key(req: Request) -> OrderKey:
    """Higher priority first, then earlier (re)queue time, then arrival."""
    return (-req.priority, req.queue_time, req.seq)


# A heap entry: the order key's fields, flat (one pointer less to follow per comparison
# in a heap of 10,000s), then the request. Unique before the request (seq is).
_Slot = tuple[int, float, int, Request]


@dataclass(init=False)  # a written __init__: mypyc compiles it (see model.Request)
class Bucket:
    key: BucketKey
    heap: list[_Slot]
    count: int
    # Heap entries of requests that left from below the top (at most): while 0, the top
    # is live without a look at the queue's index.
    stale: int
    # Set when the head failed to fit or preempt; cleared when room frees up for it.
    inadmissible: bool

    def __init__(self, key: BucketKey) -> None:
        self.key = key
        self.heap = []
        self.count = 0
        self.stale = 0
        self.inadmissible = False


class TenantQueue:
    def __init__(self) -> None:
        self.buckets: dict[BucketKey, Bucket] = {}
        # Each queued request's live heap entry. An entry on a heap that is not the one
        # here (the request left, or was pushed again) is stale and dropped at the top.
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
        slot = (-req.priority, req.queue_time, req.seq, req)
        heappush(bucket.heap, slot)
        bucket.count += 1
        self._slot[req.id] = slot
        return bucket

    def remove(self, rid: str) -> Request | None:
        """Take a request out. Its heap entry is dropped now if it is the bucket's head,
        else when it reaches the top: the removal pays for its own heap work, not the
        next cycle that looks at the head."""
        slot = self._slot.pop(rid, None)
        if slot is None:
            return None
        req = slot[3]
        bkey = (req.flavor, req.gpus)
        bucket = self.buckets[bkey]
        bucket.count -= 1
        if bucket.count == 0:
            del self.buckets[bkey]
        elif _same(bucket.heap[0], slot):
            heappop(bucket.heap)  # the head leaves (an admission): no stale entry
            self._live(bucket)
        else:
            bucket.stale += 1
        return req

    def _live(self, bucket: Bucket) -> bool:
        """Drop stale entries from the top; True when the bucket's heap has a head. (A bool,
        not the entry: mypyc keeps the entry unboxed, and an optional one is boxed again.)"""
        heap = bucket.heap
        if not bucket.stale:
            return bool(heap)
        slots = self._slot
        while heap:
            top = heap[0]
            live = slots.get(top[3].id)
            if live is not None and _same(live, top):
                return True
            heappop(heap)
            bucket.stale -= 1
        return False

    def head(self, bucket: Bucket) -> Request | None:
        return bucket.heap[0][3] if self._live(bucket) else None

    def heads(self, include_inadmissible: bool = False) -> list[Bucket]:
        """The buckets with a head, in queue order of their heads (each bucket's head is
        `bucket.heap[0][3]`, live: stale entries above it were dropped)."""
        out: list[Bucket] = []
        for bucket in self.buckets.values():
            if bucket.inadmissible and not include_inadmissible:
                continue
            if self._live(bucket):
                out.append(bucket)
        n = len(out)
        # Most nominations see one or two heads: those are ordered by hand, building no
        # key (compiled, a key read off the heap is a new tuple each time).
        if n == 2:
            if _before(out[1].heap[0], out[0].heap[0]):
                out.reverse()
        elif n > 2:
            out.sort(key=_head_key)
        return out

    def first(self) -> Request | None:
        heads = self.heads(include_inadmissible=True)
        return heads[0].heap[0][3] if heads else None

    def clear_marks(self) -> None:
        for bucket in self.buckets.values():
            bucket.inadmissible = False

    def requests(self) -> Iterator[Request]:
        return (slot[3] for slot in self._slot.values())

    def ahead_of(self, req: Request) -> int:
        """How many queued requests of this tenant go before `req` (a scan: for display)."""
        mine = order_key(req)
        return sum(1 for slot in self._slot.values() if slot[:3] < mine)


def _head_key(bucket: Bucket) -> OrderKey:
    top = bucket.heap[0]
    return (top[0], top[1], top[2])


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
