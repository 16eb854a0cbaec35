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
