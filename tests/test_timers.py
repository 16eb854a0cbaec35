"""The core's deadlines (timers.py) fire exactly as one heap with lazy invalidation would.

Timers keeps most entries in lanes (queues sorted by time) and the rest in a heap; the
order deadlines fire in, and which ones, must be the single heap's, stale entries
included: one dropped too early could not come alive again when its key is set to the
same time. The reference below is that heap, as timers.py was before the lanes."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpuaas.admission.timers import Timers


class _OneHeap:
    def __init__(self) -> None:
        self.heap: list[tuple[float, int, str, str]] = []
        self.due: dict[tuple[str, str], float] = {}
        self.seq = 0

    def set(self, kind: str, key: str, t: float) -> None:
        self.due[(kind, key)] = t
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, key))

    def clear(self, kind: str, key: str) -> None:
        self.due.pop((kind, key), None)

    def _drop_stale(self) -> None:
        while self.heap and self.due.get(self.heap[0][2:]) != self.heap[0][0]:
            heapq.heappop(self.heap)

    def next(self) -> float | None:
        self._drop_stale()
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now: float) -> tuple[float, str, str] | None:
        self._drop_stale()
        if not self.heap or self.heap[0][0] > now:
            return None
        t, _, kind, key = heapq.heappop(self.heap)
        del self.due[(kind, key)]
        return t, kind, key


_KINDS = ("cull", "expire", "node_ready")
_op = st.one_of(
    # Set at now plus one of a few timeouts (what the core does), or at any time.
    st.tuples(
        st.just("set"),
        st.sampled_from(_KINDS),
        st.integers(0, 5),
        st.one_of(st.sampled_from([0, 3, 10, 30]), st.integers(-5, 40)),
    ),
    st.tuples(st.just("clear"), st.sampled_from(_KINDS), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("advance"), st.just(""), st.just(0), st.integers(0, 12)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_op, max_size=120))
@pytest.mark.slow
def test_deadlines_fire_in_the_order_of_one_heap(ops: list[tuple[str, str, int, int]]) -> None:
    timers, ref = Timers(), _OneHeap()
    now = 0.0
    for op, kind, k, n in ops:
        key = f"r{k}"
        if op == "set":
            t = now + n if n >= 0 else float(-n)  # now plus a timeout, or a time in the past
            timers.set(kind, key, t)
            ref.set(kind, key, t)
        elif op == "clear":
            timers.clear(kind, key)
            ref.clear(kind, key)
        else:
            now += n
            while True:
                got, want = timers.pop_due(now), ref.pop_due(now)
                assert got == want
                if got is None:
                    break
        assert timers.next() == ref.next()
        assert timers.get(kind, key) == ref.due.get((kind, key))


def test_a_key_set_again_to_the_same_time_fires_once_in_its_old_place() -> None:
    timers = Timers()
    timers.set("cull", "a", 10.0)
    timers.set("expire", "b", 10.0)
    timers.clear("cull", "a")
    timers.set("cull", "a", 10.0)  # the old entry, first at 10, is live again
    assert timers.pop_due(10.0) == (10.0, "cull", "a")
    assert timers.pop_due(10.0) == (10.0, "expire", "b")
    assert timers.pop_due(10.0) is None


def test_a_stale_entry_behind_the_earliest_stays_until_it_is_the_earliest() -> None:
    timers = Timers()
    timers.set("cull", "a", 10.0)
    timers.set("expire", "x", 5.0)
    timers.clear("cull", "a")  # stale, but not the earliest: x is
    assert timers.next() == 5.0
    timers.set("expire", "b", 10.0)
    timers.set("cull", "a", 10.0)  # a's first entry, set before b's, is live again
    assert [timers.pop_due(10.0) for _ in range(4)] == [
        (5.0, "expire", "x"),
        (10.0, "cull", "a"),
        (10.0, "expire", "b"),
        None,
    ]
