"""Property tests: random small but rich scenarios must never break the invariants.

Hand-written scenarios pin one rule each; random ones find the interactions nobody wrote
down (a cull during a preemption, a scale-down racing a resume, a cohort whose lending
limit is hit by a fallback flavor). Scenarios are built as plain dicts and go through
`parse_scenario`, so they are exactly what a user could write; a failure prints the
scenario as YAML, ready to be saved under tests/scenarios/.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import check_result, check_run, events_of

from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.report import build_result
from jupyter_gpuaas.sim.scenario import parse_scenario

FLAVOR_NAMES = ("a100", "t4")
TENANT_NAMES = ("alpha", "beta", "gamma", "delta")
KINDS = ("server", "kernel", "job")
# CI runs a fixed 150 examples; GPUAAS_HYPOTHESIS_EXAMPLES=5000 hunts for more, at random.
_HUNT = int(os.environ.get("GPUAAS_HYPOTHESIS_EXAMPLES", "0"))
PROFILE = settings(
    max_examples=_HUNT or 150,
    deadline=None,
    derandomize=not _HUNT,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Draw = Any  # hypothesis' draw function


@st.composite
def scenarios(draw: Draw) -> dict[str, Any]:
    """A scenario dict in SCENARIO.md's format, respecting its validation rules."""
    nflavors = draw(st.integers(1, 2))
    flavors = {
        name: {"nodes": draw(st.integers(1, 3)), "gpus_per_node": draw(st.integers(1, 8))}
        for name in FLAVOR_NAMES[:nflavors]
    }
    ntenants = draw(st.integers(1, 4))
    cohorts = draw(st.sampled_from(["none", "one", "mixed", "tree", "tree"]))
    # A tree: org > (mid > team), org > ops; tenants sit at any level. Only cohorts with a
    # parent have limits; any cohort may own quota.
    tree: dict[str, Any] = {}
    if cohorts == "tree":
        for cname, parent in (("org", None), ("mid", "org"), ("team", "mid"), ("ops", "org")):
            cspec: dict[str, Any] = {} if parent is None else {"parent": parent}
            if draw(st.integers(0, 2)) == 0:
                cspec["quota"] = {f: draw(st.integers(0, 4)) for f in flavors}
            if parent is not None:
                for key in ("borrowing_limit", "lending_limit"):
                    if draw(st.integers(0, 2)) == 0:
                        cspec[key] = {f: draw(st.integers(0, 6)) for f in flavors}
            if draw(st.integers(0, 3)) == 0:
                cspec["weight"] = draw(st.sampled_from([1, 2, 0.5]))
            tree[cname] = cspec
    tenants: dict[str, Any] = {}
    for name in TENANT_NAMES[:ntenants]:
        spec: dict[str, Any] = {}
        owned = draw(st.lists(st.sampled_from(list(flavors)), min_size=1, unique=True))
        spec["quota"] = {f: draw(st.integers(0, 10)) for f in owned}
        if cohorts == "tree":
            cohort = draw(st.sampled_from([None, "team", "team", "mid", "ops", "org"]))
        else:
            cohort = {
                "none": None,
                "one": "c",
                "mixed": draw(st.sampled_from([None, "c", "d"])),
            }[cohorts]
        if cohort is not None:
            spec["cohort"] = cohort
            for key in ("borrowing_limit", "lending_limit"):
                if draw(st.booleans()):
                    limits = {}
                    for f, nominal in spec["quota"].items():
                        if draw(st.booleans()):
                            top = nominal if key == "lending_limit" else 6
                            limits[f] = draw(st.integers(0, top))
                    if limits:
                        spec[key] = limits
        if draw(st.booleans()):
            spec["weight"] = draw(st.sampled_from([1, 2, 3, 0.5]))
        spec["queueing"] = draw(st.sampled_from(["BestEffortFIFO", "BestEffortFIFO", "StrictFIFO"]))
        if draw(st.booleans()):
            spec["preemption"] = {
                "within_tenant": draw(
                    st.sampled_from(["Never", "LowerPriority", "LowerOrNewerEqualPriority"])
                ),
                "reclaim_within_cohort": draw(st.sampled_from(["Never", "LowerPriority", "Any"])),
                "borrow_within_cohort": draw(st.sampled_from(["Never", "LowerPriority"])),
            }
        if draw(st.integers(0, 3)) == 0:
            spec["preemption_grace"] = draw(st.sampled_from([0, 5, 30]))
        tenants[name] = spec

    policy: dict[str, Any] = {"fair_sharing": draw(st.booleans())}
    if draw(st.booleans()):
        policy["preemption_grace"] = draw(st.integers(1, 60))
    if draw(st.booleans()):
        policy["idle_timeout"] = draw(st.integers(5, 60))
        if draw(st.booleans()):
            policy["reservation_ttl"] = draw(st.integers(5, 80))
    if draw(st.booleans()):
        auto = {}
        for f, fl in flavors.items():
            if draw(st.booleans()):
                auto[f] = {
                    "max_nodes": fl["nodes"] + draw(st.integers(0, 2)),
                    "provision_delay": draw(st.integers(0, 30)),
                    "scale_down_after": draw(st.integers(1, 60)),
                }
        if auto:
            policy["autoscale"] = auto

    requests = []
    for i in range(draw(st.integers(1, 25))):
        known = list(tenants)
        tenant = draw(st.sampled_from([*known, *known, *known, "nobody"]))
        kind = draw(st.sampled_from(KINDS))
        submit = draw(st.integers(0, 150))
        duration = draw(st.integers(1, 120))
        req: dict[str, Any] = {
            "id": f"r{i}",
            "tenant": tenant,
            "user": draw(st.sampled_from(["ann", "bob"])),
            "kind": kind,
            "gpus": draw(st.integers(1, 9)),
            "submit": submit,
            "duration": duration,
        }
        if draw(st.integers(0, 4)) == 0:
            req["flavor"] = draw(st.sampled_from([*flavors, "h100"]))
        if draw(st.booleans()):
            req["priority"] = draw(st.integers(0, 3))
        if draw(st.integers(0, 2)) == 0:
            points = sorted(draw(st.sets(st.integers(0, duration + 40), min_size=2, max_size=6)))
            pairs = [(points[j], points[j + 1]) for j in range(0, len(points) - 1, 2)]
            req["busy"] = [list(p) for p in pairs]
        if draw(st.integers(0, 5)) == 0:
            req["cancel"] = submit + draw(st.integers(1, 150))  # ==submit: 53-*.yaml
        requests.append(req)

    data: dict[str, Any] = {
        "flavors": flavors,
        "tenants": tenants,
        "policy": policy,
        "requests": requests,
    }
    if tree:
        data["cohorts"] = tree
    if draw(st.integers(0, 3)) == 0:
        data["until"] = draw(st.integers(50, 400))
    # Drawn last, so the draws before it (and the differential test's kept cases, drawn
    # before the key existed) stay as they were.
    if draw(st.integers(0, 3)) == 0:
        policy["one_head_per_cycle"] = True
    return data


def show(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


@PROFILE
@given(scenarios())
@pytest.mark.slow
def test_random_scenarios_keep_invariants(data: dict[str, Any]) -> None:
    """All invariants, BestEffortFIFO's no-fitting-request-left-behind and legal lives hold;
    the run is deterministic; the result reports every request in a legal state."""
    scenario = parse_scenario(data, name="random")
    try:
        first = run_scenario(scenario)
        again = events_of(run_scenario(scenario).decisions)
    except Exception as exc:
        raise AssertionError(f"the run crashed: {exc!r}\n--- scenario:\n{show(data)}") from exc
    events = events_of(first.decisions)
    problems = check_run(scenario, events)
    if again != events:
        problems.append("not deterministic: a second run made different decisions")
    result = build_result(scenario, first.decisions, first.end, 0.0)
    problems += check_result(scenario, result, events)
    assert not problems, (
        "\n".join(problems[:12])
        + "\n--- scenario:\n"
        + show(data)
        + "--- events:\n"
        + "\n".join(map(str, events[:120]))
    )


@PROFILE
@given(scenarios())
@pytest.mark.slow
def test_flat_cohorts_declared_as_roots_decide_the_same(data: dict[str, Any]) -> None:
    """A flat cohort is a tree of one level: declaring every flat cohort as a root of
    `cohorts:` (no quota, no parent) must not change a single decision. This pins the tree
    ledger, the hierarchical preemption rules and the tournament to the flat rules."""
    if "cohorts" in data:
        return
    names = {t["cohort"] for t in data["tenants"].values() if "cohort" in t}
    if not names:
        return
    flat = parse_scenario(data, name="flat")
    tree = parse_scenario({**data, "cohorts": {n: {} for n in sorted(names)}}, name="tree")
    flat_events = events_of(run_scenario(flat).decisions)
    tree_events = events_of(run_scenario(tree).decisions)
    assert flat_events == tree_events, "--- scenario:\n" + show(data)
