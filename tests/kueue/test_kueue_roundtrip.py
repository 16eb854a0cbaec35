"""One quota format both ways: `import(manifests(q)) == q` for every scenario we ship and
for random quota files, through the YAML text the commands print."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kueue_objects import config_of, kueue_refuses, scenario_configs, validate

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.model import Config
from jupyter_gpuaas.kubeapi.meta import ManifestError, cluster_flavors
from jupyter_gpuaas.kubernetes.cli import to_yaml
from jupyter_gpuaas.kubernetes.kueue import manifests
from jupyter_gpuaas.kubernetes.kueue_import import flatten, import_objects

CONFIGS = scenario_configs()


def round_trip(config: Config, resources: dict[str, str] | None = None, crds: Any = None) -> Config:
    """The quota file through `kueue manifests`' YAML and back through `kueue import`
    (each object validated against its CRD on the way, given `crds`)."""
    docs = manifests(config, cluster_flavors(config, {}, resources or {}), "jhub")
    for doc in docs if crds is not None else ():
        validate(doc, crds)
    text = to_yaml(docs)
    objects = flatten(yaml.safe_load_all(text), "manifests.yaml")
    data = import_objects(objects)
    # What `import` prints is itself a quota file that the same YAML reads back.
    return parse_config(yaml.safe_load(yaml.safe_dump(data, sort_keys=False)))


@pytest.mark.parametrize("name,data", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_every_scenario_round_trips(name: str, data: dict[str, Any]) -> None:
    """...or, for a quota file Kueue cannot hold, `manifests` refuses it with the reason
    (docs/KUEUE.md lists the difference)."""
    config = config_of(data)
    if kueue_refuses(config):
        with pytest.raises(ManifestError, match="Kueue refuses borrow_within_cohort"):
            round_trip(config)
        return
    back = round_trip(config)
    assert back == config
    # The quota order is the order flavors are tried in: kept, not only the contents.
    for t in config.tenants.values():
        assert list(back.tenants[t.name].quota) == list(t.quota)


FLAVORS = ("a100", "t4", "mig")
TENANTS = ("alpha", "beta", "gamma")
COHORTS = ("org", "mid", "team", "ops")
_HUNT = int(os.environ.get("GPUAAS_HYPOTHESIS_EXAMPLES", "0"))
Draw = Any


@st.composite
def quota_files(draw: Draw) -> tuple[dict[str, Any], dict[str, str]]:
    """A quota file in SCENARIO.md's format (every field the format has, at odd values:
    fractional weights and seconds, zero quotas, limits at the bounds), and which flavors
    count another extended resource."""
    flavors = {
        f: {"nodes": draw(st.integers(0, 4)), "gpus_per_node": draw(st.integers(1, 8))}
        for f in FLAVORS[: draw(st.integers(1, 3))]
    }
    weights = st.one_of(
        st.sampled_from([1, 2, 0.5, 1 / 3, 0.001]), st.floats(0.01, 100, allow_nan=False)
    )
    seconds = st.one_of(st.integers(0, 86400), st.floats(0, 86400, allow_nan=False))
    amounts = st.integers(0, 12)
    shape = draw(st.sampled_from(["none", "flat", "tree"]))
    cohorts: dict[str, Any] = {}
    if shape == "tree":
        for name, parent in (("org", None), ("mid", "org"), ("team", "mid"), ("ops", "org")):
            spec: dict[str, Any] = {} if parent is None else {"parent": parent}
            for key in ("quota", "borrowing_limit", "lending_limit"):
                if (key == "quota" or parent is not None) and draw(st.booleans()):
                    spec[key] = draw(st.dictionaries(st.sampled_from(list(flavors)), amounts))
            if draw(st.booleans()):
                spec["weight"] = draw(weights)
            cohorts[name] = spec
    tenants: dict[str, Any] = {}
    for name in TENANTS[: draw(st.integers(1, 3))]:
        owned = draw(st.lists(st.sampled_from(list(flavors)), unique=True))
        spec = {"quota": {f: draw(amounts) for f in owned}}
        cohort = {
            "none": None,
            "flat": draw(st.sampled_from([None, "c", "d"])),
            "tree": draw(st.sampled_from([None, *COHORTS])),
        }[shape]
        if cohort is not None:
            spec["cohort"] = cohort
            for key in ("borrowing_limit", "lending_limit"):
                chosen = draw(st.lists(st.sampled_from(owned), unique=True)) if owned else []
                if chosen:
                    top = {f: spec["quota"][f] if key == "lending_limit" else 12 for f in chosen}
                    spec[key] = {f: draw(st.integers(0, top[f])) for f in chosen}
        if draw(st.booleans()):
            spec["weight"] = draw(weights)
        spec["queueing"] = draw(st.sampled_from(["BestEffortFIFO", "StrictFIFO"]))
        if draw(st.booleans()):
            spec["preemption"] = {
                "within_tenant": draw(
                    st.sampled_from(["Never", "LowerPriority", "LowerOrNewerEqualPriority"])
                ),
                "reclaim_within_cohort": draw(st.sampled_from(["Never", "LowerPriority", "Any"])),
                "borrow_within_cohort": draw(st.sampled_from(["Never", "LowerPriority"])),
            }
        for key in ("idle_timeout", "reservation_ttl", "preemption_grace"):
            if draw(st.integers(0, 3)) == 0:
                spec[key] = draw(seconds)
        tenants[name] = spec
    policy: dict[str, Any] = {}
    if draw(st.booleans()):
        policy["fair_sharing"] = draw(st.booleans())
    for key in ("idle_timeout", "reservation_ttl", "cull_warning", "lease_ttl", "preemption_grace"):
        if draw(st.integers(0, 2)) == 0:
            policy[key] = draw(seconds)
    auto = {}
    for f, fl in flavors.items():
        if draw(st.integers(0, 2)) == 0:
            auto[f] = {"max_nodes": fl["nodes"] + draw(st.integers(0, 3))}
            if draw(st.booleans()):
                auto[f]["provision_delay"] = draw(seconds)
                auto[f]["scale_down_after"] = draw(seconds)
                auto[f]["provision"] = draw(st.booleans())
    if auto:
        policy["autoscale"] = auto
    data: dict[str, Any] = {"flavors": flavors, "tenants": tenants}
    if cohorts:
        data["cohorts"] = cohorts
    if policy:
        data["policy"] = policy
    resources = draw(
        st.dictionaries(
            st.sampled_from(list(flavors)),
            st.sampled_from(["nvidia.com/mig-1g.10gb", "amd.com/gpu"]),
        )
    )
    return data, resources


@pytest.mark.slow
@settings(
    max_examples=_HUNT or 200,
    deadline=None,
    derandomize=not _HUNT,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(quota_files())
def test_random_quota_files_round_trip(
    crds: Any, drawn: tuple[dict[str, Any], dict[str, str]]
) -> None:
    data, resources = drawn
    config = parse_config(data)
    if kueue_refuses(config):
        with pytest.raises(ManifestError, match="Kueue refuses borrow_within_cohort"):
            round_trip(config, resources)
        return
    back = round_trip(config, resources, crds)
    assert back == config, yaml.safe_dump(data, sort_keys=False)
    for t in config.tenants.values():
        assert list(back.tenants[t.name].quota) == list(t.quota)
