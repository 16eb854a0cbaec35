"""`core.waiting_for`: the typed reason nomination leaves for every queued request, and
the sentence words.reason_sentence makes of it."""

from __future__ import annotations

from typing import Any

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.words import reason_sentence


def req(rid: str, tenant: str, gpus: int, user: str = "ann", prio: int = 0) -> Request:
    return Request(
        id=rid, tenant=tenant, user=user, kind="kernel", gpus=gpus, submit_time=0.0,
        priority=prio,
    )  # fmt: skip


def core_of(doc: dict[str, Any]) -> AdmissionCore:
    return AdmissionCore(parse_config(doc))


def why(core: AdmissionCore, rid: str) -> tuple[str, str]:
    got = core.waiting_for(rid)
    assert got is not None
    kind, details = got
    return kind, reason_sentence(kind, details)


def test_quota_flat_cohort_lends_none() -> None:
    core = core_of(
        {
            "flavors": {"a100": {"nodes": 2, "gpus_per_node": 8}},
            "tenants": {
                "vision": {"cohort": "lab", "quota": {"a100": 4}},
                "nlp": {"cohort": "lab", "quota": {"a100": 2}},
            },
        }
    )
    core.submit(req("n", "nlp", 2), 0.0)
    core.submit(req("v", "vision", 4), 0.0)
    core.submit(req("w", "vision", 2, user="bob"), 0.0)
    core.submit(req("w2", "vision", 2, user="cy"), 0.0)
    core.step(0.0)
    assert core.waiting_for("v") is None  # admitted
    assert why(core, "w") == ("quota", "vision uses all 4 of its a100 and the cohort lends none")
    kind, details = core.waiting_for("w2")  # type: ignore[misc]
    assert (kind, details["head"]) == ("quota", "w")  # behind its bucket's head
    assert core.waiting_for("nope") is None


def test_capacity_with_a_node_being_added() -> None:
    core = core_of(
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
            "tenants": {"vision": {"quota": {"a100": 8}}},
            "policy": {"autoscale": {"a100": {"max_nodes": 2, "provision_delay": 300}}},
        }
    )
    core.submit(req("a", "vision", 1), 0.0)
    core.submit(req("b", "vision", 2, user="bob"), 0.0)
    core.step(0.0)
    kind, details = core.waiting_for("b")  # type: ignore[misc]
    assert (kind, details["free"], details["coming"]) == ("capacity", 1, 1)
    assert reason_sentence(kind, details) == "no a100 node has 2 free GPUs; 1 node being added"


def test_capacity_without_autoscale() -> None:
    core = core_of(
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
            "tenants": {"vision": {"quota": {"a100": 8}}},
        }
    )
    core.submit(req("a", "vision", 2), 0.0)
    core.submit(req("b", "vision", 1, user="bob"), 0.0)
    core.step(0.0)
    assert why(core, "b") == ("capacity", "no a100 node has 1 free GPU")


def test_capacity_names_the_flavor_it_would_go_to_now() -> None:
    """A head blocked by devices in its first flavor, whose quota there is then taken by
    another admission while it sleeps, waits for devices of its next flavor: the reason
    says so at once (and autoscaling asks for those nodes: scenario 79)."""
    core = core_of(
        {
            "flavors": {
                "t4": {"nodes": 1, "gpus_per_node": 4},
                "a100": {"nodes": 1, "gpus_per_node": 4},
            },
            "tenants": {"beta": {"quota": {"t4": 3, "a100": 5}}, "ops": {"quota": {"t4": 2}}},
        }
    )
    pinned = {"z": ("ops", "t4", 2), "x": ("beta", "a100", 2)}
    for rid, (tenant, flavor, gpus) in pinned.items():
        r = req(rid, tenant, gpus, user=rid)
        r.flavor = flavor
        core.submit(r, 0.0)
    core.submit(req("w", "beta", 3), 0.0)
    core.step(0.0)
    assert why(core, "w") == ("capacity", "no t4 node has 3 free GPUs")
    y = req("y", "beta", 1, user="bob")
    y.flavor = "t4"
    core.submit(y, 1.0)
    core.step(1.0)
    assert core.get("y").state.value == "admitted"
    assert why(core, "w") == ("capacity", "no a100 node has 3 free GPUs")


def test_strict_fifo_head_and_the_requests_behind_it() -> None:
    core = core_of(
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 8}},
            "tenants": {"vision": {"quota": {"a100": 4}, "queueing": "StrictFIFO"}},
        }
    )
    core.submit(req("a", "vision", 3), 0.0)
    core.submit(req("big", "vision", 2, user="bob"), 1.0)
    core.submit(req("small", "vision", 1, user="cy"), 2.0)  # would fit, but FIFO
    core.step(2.0)
    assert why(core, "big") == ("quota", "vision uses 3 of its 4 a100 and it asks for 2")
    kind, text = why(core, "small")
    assert kind == "fifo"
    assert text == "behind big, the first request of vision, which goes first (StrictFIFO)"


def test_quota_in_a_cohort_tree_counts_what_the_tree_lends() -> None:
    doc = {
        "flavors": {"a100": {"nodes": 2, "gpus_per_node": 8}},
        "cohorts": {
            "org": {},
            "research": {"parent": "org"},
            "ops": {"parent": "org", "quota": {"a100": 2}, "lending_limit": {"a100": 1}},
        },
        "tenants": {
            "vision": {"cohort": "research", "quota": {"a100": 2}},
            "nlp": {"cohort": "research", "quota": {"a100": 2}},
        },
    }
    core = core_of(doc)
    core.submit(req("n", "nlp", 2), 0.0)
    core.submit(req("v", "vision", 2), 0.0)
    core.submit(req("w", "vision", 3, user="bob"), 0.0)
    core.step(0.0)
    kind, details = core.waiting_for("w")  # type: ignore[misc]
    assert kind == "quota"
    assert (details["used"], details["nominal"], details["cohort"]) == (2, 2, "research")
    assert details["lendable"] == 1  # ops lends at most 1 of its 2
    assert reason_sentence(kind, details) == (
        "vision uses all 2 of its a100 and the cohort lends 1 of the 3 it needs"
    )
