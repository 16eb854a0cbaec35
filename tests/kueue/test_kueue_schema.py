"""Every object `kueue manifests` prints is one the pinned Kueue's API accepts: the
version we write is the one it stores, and each object validates against its CRD's
schema, strictly (an unknown field is an error, as with `--validate=strict`)."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from kueue_objects import KINDS, config_of, kueue_refuses, scenario_configs, validate

from jupyter_gpuaas.kubeapi.meta import cluster_flavors
from jupyter_gpuaas.kubernetes.kueue import API_VERSION, manifests

# Those Kueue cannot hold are refused by `manifests` (test_kueue_roundtrip pins that).
CONFIGS = [(n, d) for n, d in scenario_configs() if not kueue_refuses(config_of(d))]


def build(data: dict[str, Any], resources: dict[str, str] | None = None) -> list[dict[str, Any]]:
    config = config_of(data)
    return manifests(config, cluster_flavors(config, {}, resources or {}), "jhub")


def test_we_write_the_version_kueue_stores(crds: dict[tuple[str, str], Any]) -> None:
    version = API_VERSION.rsplit("/", 1)[1]
    for kind in KINDS:
        entry = crds[(version, kind)]
        assert entry["served"] and entry["storage"], (kind, version)
        assert not entry.get("deprecated"), (kind, version)


def test_the_scenarios_are_found() -> None:
    names = [name for name, _ in CONFIGS]
    assert any(n.startswith("scenarios/") for n in names)
    assert any(n.startswith("examples/") for n in names)


@pytest.mark.parametrize("name,data", CONFIGS, ids=[n for n, _ in CONFIGS])
@pytest.mark.slow
def test_every_object_validates(
    crds: dict[tuple[str, str], Any], name: str, data: dict[str, Any]
) -> None:
    config = config_of(data)
    docs = build(data)
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ResourceFlavor") == len(config.flavors)
    assert kinds.count("ClusterQueue") == len(config.tenants)
    assert kinds.count("LocalQueue") == len(config.tenants)
    assert kinds.count("Cohort") == len(config.cohorts)
    for doc in docs:
        validate(doc, crds)


def test_two_resources_make_two_resource_groups(crds: dict[tuple[str, str], Any]) -> None:
    data = {
        "flavors": {f: {"nodes": 1, "gpus_per_node": 4} for f in ("a100", "mig", "h100")},
        "tenants": {"vision": {"quota": {"a100": 2, "mig": 7, "h100": 1}}},
    }
    docs = build(data, {"mig": "nvidia.com/mig-1g.10gb"})
    (cq,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    groups = cq["spec"]["resourceGroups"]
    assert [g["coveredResources"] for g in groups] == [
        ["nvidia.com/gpu"],
        ["nvidia.com/mig-1g.10gb"],
    ]
    assert [f["name"] for f in groups[0]["flavors"]] == ["a100", "h100"]
    # Kueue's groups lose the quota order; the annotation keeps it.
    assert cq["metadata"]["annotations"]["gpuaas.jupyter.org/flavor-order"] == "a100,mig,h100"
    for doc in docs:
        validate(doc, crds)


def _cluster_queue() -> dict[str, Any]:
    data = {
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}},
        "tenants": {"vision": {"quota": {"a100": 2}, "cohort": "c", "weight": 0.5}},
    }
    (cq,) = [d for d in build(data) if d["kind"] == "ClusterQueue"]
    return cq


@pytest.mark.parametrize(
    "break_it,where",
    [
        # v1beta1's name for the cohort, which v1beta2 no longer has.
        (lambda cq: cq["spec"].update(cohort=cq["spec"].pop("cohortName")), "cohort"),
        (lambda cq: cq["spec"].update(queueingStrategy="FIFO"), "FIFO"),
        (
            lambda cq: cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(
                nominalQuota=1.5
            ),
            "1.5",
        ),
        (
            lambda cq: cq["spec"]["preemption"].update(borrowWithinCohort="LowerPriority"),
            "LowerPriority",
        ),
    ],
    ids=["v1beta1-cohort", "queueing", "float-quota", "borrow-within-cohort-string"],
)
def test_the_validation_can_fail(
    crds: dict[tuple[str, str], Any], break_it: Any, where: str
) -> None:
    cq = _cluster_queue()
    validate(copy.deepcopy(cq), crds)
    break_it(cq)
    with pytest.raises(jsonschema.ValidationError) as e:
        validate(cq, crds)
    assert where in str(e.value)


@pytest.mark.parametrize(
    "annotations,where",
    [({"not a key!": "x"}, "not a key"), ({"gpuaas.jupyter.org/nodes": 2}, "2")],
    ids=["key", "value-not-a-string"],
)
def test_the_metadata_validation_can_fail(
    crds: dict[tuple[str, str], Any], annotations: dict[str, Any], where: str
) -> None:
    cq = _cluster_queue()
    cq["metadata"]["annotations"] = annotations
    with pytest.raises(Exception, match=where):
        validate(cq, crds)
