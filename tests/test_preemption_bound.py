"""The preemption bound never rules out a preemption the search would find.

`Holders.victim_pool` answers most preemption questions of a cycle without a search: None
when no victim set could make room in quota (the bound, `preemption_room`), [] when quota
would do but no node would have room, else the candidates, which in a flat cohort without
`borrow_within_cohort` are the tenant's own alone for a head that would end above nominal
(others' holders help only a tenant ending within nominal). The wake-ups read the same
bound (`_could_preempt`), so a bound that is too tight would be a missed wake-up and a
preemption never made.

Checked against `find_victims` given every holder of the flavor in the head's tree (the
search's own rules decide who may go): on random scenarios stopped at random instants,
for every tenant, flavor, priority and size of head.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import _HUNT, PROFILE, scenarios, show

from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.admission.preemption import find_victims
from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.scenario import parse_scenario

# Few random instants hold a head that only others' holders could make room for: more
# examples than the other properties (1,000 take ~12 s; 150 missed a bound made tighter
# by hand).
EXAMPLES = settings(PROFILE, max_examples=_HUNT or 1000)


@pytest.mark.slow
@EXAMPLES
@given(scenarios(), st.integers(0, 200))
def test_the_bound_keeps_every_preemption_the_search_finds(data: dict[str, Any], at: int) -> None:
    scenario = parse_scenario(data, name="random")
    core = run_scenario(scenario, until=at).core
    holders = core._holders
    ledger = core._ledger
    problems: list[str] = []
    for spec in core.config.tenants.values():
        for flavor in spec.quota:
            everyone = [
                r
                for name in ledger.tree(spec.name)
                for r in holders.holding.get((name, flavor), {}).values()
            ]
            for prio in (0, 1, 2, 3, 4):
                for gpus in range(1, 10):
                    head = Request(
                        id="head", tenant=spec.name, user="u", kind="kernel", gpus=gpus,
                        submit_time=float(at), flavor=flavor, priority=prio,
                    )  # fmt: skip
                    head.queue_time = float(at)
                    head.seq = 1 << 30  # the newest request
                    found = find_victims(head, spec, flavor, ledger, core._cluster, everyone)
                    pool = holders.victim_pool(head, flavor)
                    if found is None:
                        continue
                    where = f"{spec.name} {flavor} priority {prio}, {gpus} GPUs"
                    ids = sorted(v.id for v in found)
                    if pool is None:
                        problems.append(f"{where}: the bound says no; the search evicts {ids}")
                    elif not pool:
                        problems.append(f"{where}: the bound says no node would do; {ids} do")
                    else:
                        again = find_victims(head, spec, flavor, ledger, core._cluster, pool)
                        if again != found:
                            narrowed = None if again is None else sorted(v.id for v in again)
                            problems.append(
                                f"{where}: {ids} from everyone, {narrowed} from the pool"
                            )
    assert not problems, "\n".join(problems[:10]) + f"\n--- at t={at}, scenario:\n{show(data)}"
