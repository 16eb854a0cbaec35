"""The quota ledger: `room` must be exactly the largest request `fits` admits, with or
without GPUs taken away first (the preemption bound relies on it)."""

from __future__ import annotations

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
