"""A tenant's queue, split into buckets of requests that fit or fail alike.

Two queued requests of one tenant with the same GPU count and the same flavor choice fit
the quota and the nodes in exactly the same way at any instant. So the queue keeps one
priority heap per (pinned flavor, gpus) bucket, and an admission cycle tries only each
bucket's head: if the head does not fit, nobody behind it in that bucket does. The cost of
a cycle is then in the number of buckets (a few), never in the number of queued requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from .model import Request

BucketKey = tuple[str | None, int]  # (pinned flavor or None, gpus)
OrderKey = tuple[int, float, int]  # (-priority, queue time, arrival)


def order_key(req: Request) -> OrderKey:
    """Higher priority first, then earlier (re)queue time, then arrival."""
    return (-req.priority, req.queue_time, req.seq)


@dataclass
class Bucket:
    key: BucketKey
    heap: list[tuple[OrderKey, str]] = field(default_factory=list)
    count: int = 0
    # Set when the head failed to fit or preempt; cleared when room frees up for it.
    inadmissible: bool = False


class TenantQueue:
    def __init__(self) -> None:
        self.buckets: dict[BucketKey, Bucket] = {}
        self._where: dict[str, tuple[BucketKey, OrderKey]] = {}
        self._requests: dict[str, Request] = {}
        # Parked requests that are busy again and wait for devices: served before anyone.
        self.resuming: dict[str, Request] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, rid: str) -> bool:
        return rid in self._where

    def push(self, req: Request) -> Bucket:
        bkey: BucketKey = (req.flavor, req.gpus)
        bucket = self.buckets.get(bkey)
        if bucket is None:
            bucket = self.buckets[bkey] = Bucket(bkey)
        okey = order_key(req)
        heapq.heappush(bucket.heap, (okey, req.id))
        bucket.count += 1
        self._where[req.id] = (bkey, okey)
        self._requests[req.id] = req
        return bucket

    def remove(self, rid: str) -> Request | None:
        """Take a request out; its heap entry is dropped lazily when it reaches the top."""
        where = self._where.pop(rid, None)
        if where is None:
            return None
        bucket = self.buckets[where[0]]
        bucket.count -= 1
        if bucket.count == 0:
            del self.buckets[where[0]]
        return self._requests.pop(rid)

    def head(self, bucket: Bucket) -> Request | None:
        heap = bucket.heap
        while heap:
            okey, rid = heap[0]
            if self._where.get(rid) == (bucket.key, okey):
                return self._requests[rid]
            heapq.heappop(heap)
        return None

    def heads(self, include_inadmissible: bool = False) -> list[tuple[OrderKey, Bucket, Request]]:
        """Bucket heads in queue order."""
        out = []
        for bucket in self.buckets.values():
            if bucket.inadmissible and not include_inadmissible:
                continue
            req = self.head(bucket)
            if req is not None:
                out.append((order_key(req), bucket, req))
        out.sort(key=lambda e: e[0])
        return out

    def first(self) -> Request | None:
        heads = self.heads(include_inadmissible=True)
        return heads[0][2] if heads else None

    def clear_marks(self) -> None:
        for bucket in self.buckets.values():
            bucket.inadmissible = False

    def requests(self) -> Iterator[Request]:
        return iter(self._requests.values())

    def ahead_of(self, req: Request) -> int:
        """How many queued requests of this tenant go before `req` (a scan: for display)."""
        mine = order_key(req)
        return sum(1 for _, okey in self._where.values() if okey < mine)
