"""gateway/estimates.py: one set of forward-run estimates per queue state, counting down
between decisions, made again after one; and the words of its basis."""

from __future__ import annotations

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.estimate import History
from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.gateway.estimates import Estimates, eta_of, wait_json


def test_one_set_per_queue_state() -> None:
    core = AdmissionCore(parse_config({
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
        "tenants": {"vision": {"quota": {"a100": 1}}},
        "policy": {"idle_timeout": 1800},
    }))  # fmt: skip
    core.submit(Request("a", "vision", "ann", "kernel", 1, 0.0), 0.0)
    core.step(0.0)
    core.activity("a", False, 0.0)  # culled at 1800 s
    core.submit(Request("b", "vision", "bob", "kernel", 1, 100.0), 100.0)
    core.submit(Request("c", "vision", "cy", "kernel", 1, 100.0), 100.0)
    core.step(100.0)
    cache = Estimates()
    b = cache.of("b", core, History(), 100.0)
    assert b is not None and b.seconds == 1700.0 and cache.runs == 1
    later = cache.of("b", core, History(), 110.0)  # no decision since: counts down
    assert later is not None and later.seconds == 1690.0 and cache.runs == 1
    assert cache.of("c", core, History(), 110.0) is not None and cache.runs == 1
    cache.forget()  # a decision: the next view runs the queue forward again
    assert cache.of("b", core, History(), 120.0) is not None and cache.runs == 2
    wait = wait_json(later, "a100")
    assert wait == {
        "seconds": 1690, "low": 1690, "high": 1690, "confidence": "high",
        "basis": "from running the queue forward: 1 idle grant culled by the idle policy",
    }  # fmt: skip
    assert eta_of(wait) == "in about 28 min"
    assert cache.of("nope", core, History(), 120.0) is None


def _long_queue(n: int) -> AdmissionCore:
    """One busy a100 culled at 1800 s and `n` kernels queued behind it."""
    core = AdmissionCore(parse_config({
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
        "tenants": {"vision": {"quota": {"a100": 1}}},
        "policy": {"idle_timeout": 1800},
    }))  # fmt: skip
    core.submit(Request("a", "vision", "ann", "kernel", 1, 0.0), 0.0)
    core.step(0.0)
    core.activity("a", False, 0.0)
    for i in range(n):
        core.submit(Request(f"q{i:03}", "vision", "bob", "kernel", 1, 100.0), 100.0)
    core.step(100.0)
    return core


def test_a_set_made_in_slices_answers_the_same_and_lets_the_loop_work(monkeypatch) -> None:
    """A set that one slice does not finish is made between the loop's other work: the
    view that started it answers at once ("no estimate yet"), the loop keeps turning while
    it is made, a decision meanwhile changes nothing it is made from (a copy), and the
    estimates it gives are those of the set made at once."""
    import asyncio

    from jupyter_gpuaas.admission.estimate import estimate_waits
    from jupyter_gpuaas.gateway import estimates

    core = _long_queue(200)
    past = History()
    for held in (600.0, 900.0, 1200.0) * 4:
        past.add("kernel", "bob", held)
    at_once = estimate_waits(core, 100.0, past)
    monkeypatch.setattr(estimates, "SLICE", 0.0)  # one step a slice

    async def main() -> tuple[int, object, object, int]:
        cache = Estimates()
        first = cache.of("q010", core, past, 100.0)
        turns = 0
        while cache.runs == 0:
            turns += 1  # the loop runs other work between the slices
            if turns == 3:  # a decision while the set is made: the core changes
                core.submit(Request("late", "vision", "cy", "kernel", 1, 100.0), 100.0)
                cache.forget()
            await asyncio.sleep(0)
        done = cache.of("q010", core, past, 100.0)
        return turns, first, done, cache.runs

    turns, first, done, runs = asyncio.run(main())
    assert first is None  # nothing to answer from yet: "no estimate yet"
    assert turns > 10  # made across many turns of the loop, not in one
    assert at_once["q010"].seconds is not None
    assert done is not None and done.seconds == at_once["q010"].seconds
    assert runs == 1 or runs == 2  # the decision meanwhile makes it stale (costly or not)


def test_the_basis_says_an_idle_grant_is_likely_back() -> None:
    # Past kernels' users came back after every cull: the idle "a" is expected back and
    # held for its session, and the words say so (not "culled by the idle policy").
    core = AdmissionCore(parse_config({
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
        "tenants": {"vision": {"quota": {"a100": 1}}},
        "policy": {"idle_timeout": 1800},
    }))  # fmt: skip
    core.submit(Request("a", "vision", "ann", "kernel", 1, 0.0), 0.0)
    core.step(0.0)
    core.activity("a", False, 0.0)
    core.submit(Request("b", "vision", "bob", "kernel", 1, 100.0), 100.0)
    core.step(100.0)
    history = History()
    for _ in range(30):
        history.add("kernel", "ann", 7200.0, culls=1, gave_up=False)
    wait = wait_json(Estimates().of("b", core, history, 100.0), "a100")
    assert wait["seconds"] == 7100 and wait["confidence"] == "medium"
    assert wait["basis"] == (
        "from running the queue forward: 1 idle grant whose user is likely back within "
        "its reservation"
    )


def test_a_culled_request_back_in_the_queue_is_kept_as_an_arrival() -> None:
    cache = Estimates()
    first = Request("a", "vision", "ann", "kernel", 2, 0.0, priority=100)
    cache.submitted(first)
    cache.came_back(first, 5000.0)
    assert [(r.id, r.submit_time, r.gpus, r.priority) for r in cache.arrived] == [
        ("a", 0.0, 2, 100), ("a", 5000.0, 2, 100),
    ]  # fmt: skip
    assert first.submit_time == 0.0  # the live request is not changed
