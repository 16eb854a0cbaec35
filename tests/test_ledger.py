"""The quota ledger: `room` must be exactly the largest request `fits` admits, with or
without GPUs taken away first (the preemption bound relies on it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.ledger import Ledger

TENANTS = ("a", "b", "c")


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[Ledger, str, dict[str, int], bool]:
    tenants = {}
    for name in TENANTS:
        nominal = draw(st.integers(0, 8))
        spec: dict[str, object] = {"quota": {"f": nominal}}
        if draw(st.booleans()):
            spec["cohort"] = "c1"
            if draw(st.booleans()):
                spec["borrowing_limit"] = {"f": draw(st.integers(0, 6))}
            if draw(st.booleans()):
                spec["lending_limit"] = {"f": draw(st.integers(0, nominal))}
        tenants[name] = spec
    config = parse_config({"flavors": {"f": {"nodes": 1, "gpus_per_node": 64}}, "tenants": tenants})
    ledger = Ledger(config)
    for name in TENANTS:
        for _ in range(draw(st.integers(0, 4))):
            gpus = draw(st.integers(1, 4))
            if ledger.fits(name, "f", gpus):
                ledger.add(name, "f", gpus)
    removed = {n: draw(st.integers(0, ledger.usage[(n, "f")])) for n in TENANTS}
    return ledger, draw(st.sampled_from(TENANTS)), removed, draw(st.booleans())


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ledgers())
@pytest.mark.slow
def test_room_is_the_largest_fit(case: tuple[Ledger, str, dict[str, int], bool]) -> None:
    ledger, tenant, removed, allow_borrow = case
    for rm in ({}, removed):
        room = ledger.room(tenant, "f", rm, allow_borrow)
        assert room >= 0
        if room:
            assert ledger.fits(tenant, "f", room, rm, allow_borrow)
        assert not ledger.fits(tenant, "f", room + 1, rm, allow_borrow)


def test_room_of_a_flavor_outside_quota_is_zero() -> None:
    config = parse_config(
        {
            "flavors": {
                "f": {"nodes": 1, "gpus_per_node": 4},
                "g": {"nodes": 1, "gpus_per_node": 4},
            },
            "tenants": {"a": {"quota": {"f": 2}}},
        }
    )
    assert Ledger(config).room("a", "g") == 0
    assert Ledger(config).room("a", "f") == 2


def tree_ledger(**research: object) -> Ledger:
    """Shared scenario 13's tree: org > research (vision 2, nlp 2) and ops (infra 4)."""
    doc = {
        "flavors": {"a100": {"nodes": 2, "gpus_per_node": 4}},
        "cohorts": {"org": {}, "research": {"parent": "org", **research}, "ops": {"parent": "org"}},
        "tenants": {
            "vision": {"cohort": "research", "quota": {"a100": 2}},
            "nlp": {"cohort": "research", "quota": {"a100": 2}},
            "infra": {"cohort": "ops", "quota": {"a100": 4}},
        },
    }
    return Ledger(parse_config(doc))


def test_tree_borrowing_climbs_within_the_subtree_limit() -> None:
    ledger = tree_ledger(borrowing_limit={"a100": 2})
    # nominal 2, nlp's 2 inside research, then at most 2 more from org (infra's).
    assert ledger.max_hold("vision", "a100") == 6
    ledger.add("vision", "a100", 4)  # its own 2 and nlp's 2
    assert ledger.height("vision", "a100", 2) == 2  # research is full: borrows from org
    assert ledger.fits("vision", "a100", 2)
    ledger.add("vision", "a100", 2)
    assert not ledger.fits("vision", "a100", 1)  # research's borrowing limit
    assert ledger.room("infra", "a100") == 2  # infra lends 2 of its 4 to research
    assert not ledger.fits("nlp", "a100", 1)
    assert ledger.over_quota("research", "a100")
    assert not ledger.over_quota("ops", "a100")
    ledger.remove("vision", "a100", 2)
    assert not ledger.over_quota("research", "a100", None)
    assert ledger.over_quota("research", "a100", {"nlp": 0}) is False


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ledgers(), st.integers(1, 8))
@pytest.mark.slow
def test_height_with_removed_is_the_height_once_they_are_gone(
    case: tuple[Ledger, str, dict[str, int], bool], gpus: int
) -> None:
    """The borrowing height a preemptor would have once its victims are gone (the flavor
    to preempt in is chosen by it) is the height the ledger gives after removing them."""
    ledger, tenant, removed, _ = case
    asked = ledger.height(tenant, "f", gpus, removed)
    for name, n in removed.items():
        ledger.remove(name, "f", n)
    assert asked == ledger.height(tenant, "f", gpus)


def test_tree_height_once_victims_are_gone() -> None:
    ledger = tree_ledger()
    ledger.add("vision", "a100", 3)  # its own 2, and 1 of nlp's
    ledger.add("nlp", "a100", 1)  # research full
    ledger.add("infra", "a100", 4)  # org full
    assert ledger.height("vision", "a100", 1) == 2  # only from org, infra's
    # With nlp's 1 gone, research holds it: height 1; with vision's own 1, within nominal.
    assert ledger.height("vision", "a100", 1, {"nlp": 1}) == 1
    assert ledger.height("vision", "a100", 1, {"vision": 2}) == 0
    assert ledger.height("vision", "a100", 1) == 2  # nothing was changed


def test_tree_lending_limit_caps_what_a_subtree_lends() -> None:
    doc = {
        "flavors": {"a100": {"nodes": 2, "gpus_per_node": 4}},
        "cohorts": {
            "org": {"quota": {"a100": 1}},
            "research": {"parent": "org"},
            "ops": {"parent": "org", "lending_limit": {"a100": 1}},
        },
        "tenants": {
            "vision": {"cohort": "research", "quota": {"a100": 2}},
            "infra": {"cohort": "ops", "quota": {"a100": 4}},
        },
    }
    ledger = Ledger(parse_config(doc))
    # 2 of its own, 1 that ops lends to org, 1 of org's own quota.
    assert ledger.max_hold("vision", "a100") == 4
    assert ledger.room("vision", "a100") == 4
    ledger.add("infra", "a100", 4)  # infra within nominal: what ops keeps (3) and lends (1)
    assert ledger.room("vision", "a100") == 3
    assert ledger.room("infra", "a100") == 3  # org's own GPU and vision's idle 2
    # Removing infra's GPUs in a what-if gives vision the lent one back.
    assert ledger.room("vision", "a100", {"infra": 4}) == 4
