"""Our admission core against the REAL Kueue controller (issue 42 item 5).

The same quota file and the same requests go through the core (the simulator) and through
Kueue v0.19.2 on the session's real control plane (`kueue manifests` applied, suspended
`batch/v1` Jobs in the tenants' LocalQueues, KWOK nodes with room for everything), every
request of a wave submitted at once (kueue_diff.py says how). The admitted requests, the
flavor of each, and the requests a second wave evicts must agree, except where
docs/KUEUE.md "Known differences" says why they cannot: there the test expects the
documented outcome, so it still fails when either side changes.

The cases: shipped scenarios that fit (requests compressed into one or two waves; what
Kueue has no counterpart for left out, kueue_diff.fit_for_kueue), and RANDOM ones drawn as
tests/test_properties.py draws them, with a fixed seed. Every case runs side by side on the
cluster, so the whole module costs one set of waits.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from kueue_diff import Case, KueueRun, Outcome, fit_for_kueue, keyed, run_core
from test_properties import scenarios

ROOT = Path(__file__).resolve().parents[2]
#: Shipped scenarios that fit, and the submit time from which a request is in the second
#: wave (None: one wave).
SHARED: dict[str, float | None] = {
    "01-nominal-before-borrowing": None,
    "02-borrowing-limit": None,
    "03-lending-limit": 10,
    "04-strict-fifo": None,
    "05-best-effort-fifo": None,
    "06-reclaim-within-cohort": 10,
    "11-within-tenant-preemption": 50,
    "13-cohort-tree": None,
    "35-victim-minimisation": 10,
    "36-victim-order-lower-priority-first": 10,
    "37-victims-other-tenants-first": 10,
    "38-reclaim-lower-priority": 10,
    "39-reclaim-any-ignores-priority": 10,
    "65-own-eviction-while-borrowing": 10,
    "66-within-nominal-reclaims-before-own": 10,
    "67-flavor-prefers-reclaim": 10,
    "69-tree-hierarchical-advantage": 10,
    "71-tree-lending-limit": None,
}
#: How many random cases, and from how many draws they are picked (those with at least
#: two requests left once fitted).
RANDOM = 12
DRAWS = 60


def shared_cases() -> list[Case]:
    out = []
    for name, split in SHARED.items():
        data = yaml.safe_load((ROOT / "tests" / "scenarios" / f"{name}.yaml").read_text())
        case = fit_for_kueue(name, data, split=split)
        assert case is not None, name
        out.append(case)
    return out


def random_cases() -> list[Case]:
    """The property tests' scenarios, drawn with a fixed seed (derandomized: the same
    draws every run), the second wave from submit 75 on."""
    drawn: list[dict[str, Any]] = []

    @settings(
        max_examples=DRAWS,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios())
    def collect(data: dict[str, Any]) -> None:
        drawn.append(data)

    collect()
    out = []
    for i, data in enumerate(drawn):
        case = fit_for_kueue(f"random-{i}", data, split=75)
        if case is not None and len(case.requests) >= 2:
            out.append(case)
        if len(out) == RANDOM:
            break
    return out


CASES = [(f"s{i:02d}", c) for i, c in enumerate(shared_cases())] + [
    (f"r{i:02d}", c) for i, c in enumerate(random_cases())
]
# GPUAAS_DIFF_ONLY=random-9,04-strict-fifo: only those cases (to look at one closely).
if os.environ.get("GPUAAS_DIFF_ONLY"):
    CASES = [(k, c) for k, c in CASES if c.name in os.environ["GPUAAS_DIFF_ONLY"].split(",")]


@pytest.fixture(scope="module")
def kueue(cluster: Any) -> Any:
    """Every case through the real Kueue, side by side: {case name: (the case as run,
    with its cluster-wide names, and what Kueue did)}. A token of this run in every name
    keeps it clear of a run before whose objects are still going."""
    from gpuaas_cluster import kwok_node

    token = uuid.uuid4().hex[:4]
    cases = [keyed(c, f"{key}{token}") for key, c in CASES]
    run = KueueRun(cluster, cases, kwok_node)
    try:
        run.setup()
        for wave in range(max(len(c.waves) for c in cases)):
            run.run_wave(wave)
        yield {c.name: (c, run.outcomes[c.key]) for c in cases}
    finally:
        run.teardown()


def show(case: Case) -> str:
    return yaml.safe_dump(
        {"quota": case.quota, "waves": case.waves}, sort_keys=False, default_flow_style=None
    )


@pytest.mark.parametrize("name", [c.name for _, c in CASES])
def test_core_decides_as_kueue(name: str, kueue: dict[str, tuple[Case, Outcome]]) -> None:
    case, real = kueue[name]
    core = run_core(case)
    assert (core.admitted, core.preempted) == (real.admitted, real.preempted), (
        show(case) + "Kueue's pending: " + json.dumps(real.pending, indent=1)
    )
