"""The tenant queue (admission/queues.py) against a plain list, under random operations.

The queue drops the entries of requests that left lazily, at the front, and looks a front
up in its index only once while the front stays where it is (`_Level.checked`). A mistake
there shows as a bucket whose head is a request that already left, or one that skips a
request still queued. So every bucket's head, the order of the heads and the length are
compared, after each operation, with what a list of the queued requests says: the least
(-priority, queue time, arrival) of each (pinned flavor, gpus).

The operations are the core's: a new request queued; one taken out (from the front, as an
admission does, or from anywhere, as a cancel does); one queued again by an earlier time
(a preempted job keeps its place by submit time) or by a later one (a culled request busy
again). Many requests share few buckets and priorities, so levels fill, empty, and are
compacted (`del slots[:start]` past 64 entries).
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.admission.queues import TenantQueue, order_key

_HUNT = int(os.environ.get("GPUAAS_HYPOTHESIS_EXAMPLES", "0"))
PROFILE = settings(max_examples=_HUNT or 150, deadline=None, derandomize=not _HUNT)

# (what, a number that picks the request or the new one's fields)
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "push", "admit", "cancel", "requeue"]),
        st.integers(0, 10_000),
    ),
    min_size=1,
    max_size=400,
)


class _Model:
    def __init__(self) -> None:
        self.q = TenantQueue()
        self.queued: dict[str, Request] = {}
        self.left: list[Request] = []
        self.seq = 0
        self.clock = 1000.0

    def push(self, n: int) -> None:
        self.seq += 1
        self.clock += 1.0
        req = Request(
            id=f"r{self.seq}",
            tenant="alpha",
            user="u",
            kind="job",
            gpus=(1, 2)[n % 2],  # few buckets and levels: long levels, stale entries
            submit_time=self.clock,
            flavor=(None, None, "a100")[(n // 2) % 3],
            priority=(0, 0, 5)[(n // 6) % 3],
            queue_time=self.clock,
            seq=self.seq,
        )
        self._enqueue(req)

    def _enqueue(self, req: Request) -> None:
        self.q.push(req)
        self.queued[req.id] = req

    def take(self, rid: str) -> None:
        assert self.q.remove(rid) is self.queued[rid]
        self.left.append(self.queued.pop(rid))

    def admit(self, n: int) -> None:
        """The head of a bucket leaves, as an admission takes it."""
        heads = self.q.heads(include_inadmissible=True)
        if heads:
            self.take(heads[n % len(heads)].front()[3].id)

    def cancel(self, n: int) -> None:
        if self.queued:
            self.take(sorted(self.queued)[n % len(self.queued)])

    def requeue(self, n: int) -> None:
        """A request that left comes back: earlier (its old time) or later (now)."""
        if not self.left:
            return
        req = self.left.pop(n % len(self.left))
        if n % 2:
            self.clock += 1.0
            req.queue_time = self.clock
        else:
            req.queue_time = req.submit_time
        self._enqueue(req)

    def check(self) -> None:
        assert len(self.q) == len(self.queued)
        want: dict[tuple[str | None, int], Request] = {}
        for req in self.queued.values():
            key = (req.flavor, req.gpus)
            if key not in want or order_key(req) < order_key(want[key]):
                want[key] = req
        heads = self.q.heads(include_inadmissible=True)
        got = {b.key: b.front()[3] for b in heads}
        assert {k: r.id for k, r in got.items()} == {k: r.id for k, r in want.items()}
        assert [order_key(b.front()[3]) for b in heads] == sorted(
            order_key(r) for r in want.values()
        )
        for bucket in list(self.q.buckets.values()):
            assert self.q.head(bucket) is want[bucket.key]
        first = self.q.first()
        assert first is (min(want.values(), key=order_key) if want else None)


@PROFILE
@given(_OPS)
def test_every_bucket_head_is_the_least_queued_request_of_its_bucket(ops) -> None:
    m = _Model()
    for what, n in ops:
        getattr(m, what)(n)
        m.check()


def test_a_long_level_compacts_and_keeps_its_head() -> None:
    """A level whose front passed 64 entries is compacted (its indices shift down). One
    that then grows again and is taken from up to the old front's index must still look
    that front up: an index of a front found live, kept across the compaction, would name
    an entry that has left since (here: cancelled just before the front reaches it)."""
    m = _Model()
    for _ in range(200):
        m.push(0)  # one bucket, one priority: a single level
    level = next(iter(m.q.buckets.values())).top
    assert level is not None
    old_front = -1
    while old_front < 0:  # taken from the front until the level is compacted
        before = level.start
        m.admit(0)
        m.check()
        if level.start < before:
            old_front = before + 1
    for _ in range(400):  # it grows again
        m.push(0)
    while level.start < old_front - 1:
        m.admit(0)
        m.check()
    m.take(level.slots[old_front][3].id)  # leaves from behind the front...
    m.take(level.slots[level.start][3].id)  # ... which then moves onto its entry, unlooked
    m.check()
    while m.queued:
        m.admit(0)
        m.check()
