"""`jupyter-gpuaas kueue manifests` and `kueue import` as a user runs them: exit codes,
what they print, and one line naming the file, object and field for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.cli import main

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
TWO_TEAMS = ROOT / "hub_config" / "examples" / "two-teams.yaml"
QUOTAS = {
    "flavors": {"a100": {"nodes": 2, "gpus_per_node": 4}},
    "tenants": {
        "vision": {"quota": {"a100": 4}, "cohort": "lab", "idle_timeout": 600},
        "nlp": {"quota": {"a100": 4}, "cohort": "lab", "lending_limit": {"a100": 2}},
    },
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["kueue", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, docs: list[Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def our_objects(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> list[dict[str, Any]]:
    quotas = write(tmp_path, "quotas.yaml", [QUOTAS])
    code, out, err = run(capsys, "manifests", quotas)
    assert (code, err) == (0, "")
    return list(yaml.safe_load_all(out))


def test_manifests_then_import(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    quotas = write(tmp_path, "quotas.yaml", [QUOTAS])
    code, out, err = run(capsys, "manifests", quotas, "--namespace", "users")
    assert (code, err) == (0, "")
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["ResourceFlavor"] + ["ClusterQueue"] * 2 + [
        "LocalQueue"
    ] * 2
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "LocalQueue"} == {"users"}
    assert docs[1]["spec"]["cohortName"] == "lab"
    assert docs[1]["metadata"]["annotations"] == {"gpuaas.jupyter.org/idle-timeout": "600"}
    (tmp_path / "objects.yaml").write_text(out)
    code, out, err = run(capsys, "import", str(tmp_path / "objects.yaml"))
    assert (code, err) == (0, "")
    assert parse_config(yaml.safe_load(out)) == parse_config(QUOTAS)


def test_the_resource_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    quotas = write(tmp_path, "quotas.yaml", [QUOTAS])
    code, out, _ = run(capsys, "manifests", quotas, "--resource", "amd.com/gpu")
    assert code == 0
    (cq,) = [
        d
        for d in yaml.safe_load_all(out)
        if d["kind"] == "ClusterQueue" and d["metadata"]["name"] == "vision"
    ]
    assert cq["spec"]["resourceGroups"][0]["coveredResources"] == ["amd.com/gpu"]


def test_a_scenario_file_gives_its_quota_part(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "manifests", str(ROOT / "tests/scenarios/13-cohort-tree.yaml"))
    assert (code, err) == (0, "")
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out) if d["kind"] == "Cohort"] == [
        "org",
        "research",
        "ops",
    ]


def test_import_reads_what_kubectl_get_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """A List with the server's metadata, defaults, status and quantities as strings."""
    code, out, err = run(capsys, "import", str(DATA / "kubectl-get.yaml"))
    assert (code, err) == (0, "")
    config = parse_config(yaml.safe_load(out))
    vision = config.tenants["vision"]
    assert dict(vision.quota) == {"a100": 8, "mig-1g": 7}
    assert dict(vision.lending_limit) == {"a100": 2}
    assert vision.weight == 1.5  # "1500m"
    assert vision.idle_timeout == 1800
    assert vision.preemption.reclaim_within_cohort == "Any"
    assert config.tenants["nlp"].queueing == "StrictFIFO"
    assert config.cohorts["research"].parent == "org"
    assert dict(config.cohorts["research"].borrowing_limit) == {"a100": 4}
    assert config.cohorts["research"].weight == 2
    assert "org" in config.cohorts  # named by research's parentName only
    assert config.flavors["a100"].nodes == 4 and config.flavors["a100"].gpus_per_node == 8
    assert config.policy.fair_sharing and config.policy.reservation_ttl == 900
    assert config.policy.autoscale["mig-1g"].max_nodes == 6
    assert config.policy.autoscale["mig-1g"].provision is False


def test_import_reads_standard_input(tmp_path: Path) -> None:
    """The console script, its input from a pipe (`kubectl get ... | jupyter-gpuaas kueue
    import -`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_gpuaas.cli", "kueue", "import", "-"],
        input=(DATA / "kubectl-get.yaml").read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert set(yaml.safe_load(proc.stdout)["tenants"]) == {"vision", "nlp"}


def _cq(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "ClusterQueue")


def _rf(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "ResourceFlavor")


BAD_IMPORTS = [
    (lambda d: _cq(d)["spec"].update(foo=1), "clusterqueues/vision: spec.foo: unknown field"),
    (
        lambda d: _cq(d)["spec"]["preemption"].update(reclaimWithinCohrt="Any"),
        "clusterqueues/vision: spec.preemption.reclaimWithinCohrt: unknown field",
    ),
    (
        lambda d: _cq(d)["spec"].update(queueingStrategy="FIFO"),
        "clusterqueues/vision: spec.queueingStrategy: unsupported value 'FIFO'",
    ),
    (
        lambda d: _cq(d)["spec"].update(
            admissionChecksStrategy={"admissionChecks": [{"name": "prov"}]}
        ),
        "clusterqueues/vision: spec.admissionChecksStrategy: unsupported value",
    ),
    (
        lambda d: _cq(d)["spec"]["flavorFungibility"].update(whenCanPreempt="MayStopSearch"),
        "clusterqueues/vision: spec.flavorFungibility.whenCanPreempt: unsupported value",
    ),
    (
        lambda d: _cq(d)["spec"]["preemption"]["borrowWithinCohort"].update(maxPriorityThreshold=5),
        "spec.preemption.borrowWithinCohort.maxPriorityThreshold: unsupported value 5",
    ),
    (
        lambda d: _cq(d)["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(
            nominalQuota="1500m"
        ),
        "clusterqueues/vision: spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: "
        "'1500m' is not a whole number of GPUs",
    ),
    (
        lambda d: _cq(d)["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(
            nominalQuota="lots"
        ),
        "nominalQuota: 'lots' is not a quantity",
    ),
    (
        lambda d: _cq(d)["spec"]["resourceGroups"][0]["coveredResources"].append("cpu"),
        "spec.resourceGroups[0].coveredResources: covers 2 resources",
    ),
    (
        lambda d: _rf(d)["spec"].update(topologyName="default"),
        "resourceflavors/a100: spec.topologyName: unsupported value 'default': "
        "topology-aware scheduling",
    ),
    (
        lambda d: _rf(d)["metadata"]["annotations"].pop("gpuaas.jupyter.org/nodes"),
        "resourceflavors/a100: metadata.annotations.gpuaas.jupyter.org/nodes: is required",
    ),
    (
        lambda d: _cq(d).update(apiVersion="kueue.x-k8s.io/v1alpha1"),
        "clusterqueues/vision: apiVersion: unsupported value 'kueue.x-k8s.io/v1alpha1'",
    ),
    (
        lambda d: d.append(
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "w"}}
        ),
        "kind 'Workload': not a quota object",
    ),
    (
        lambda d: _cq(d)["metadata"]["annotations"].update({"gpuaas.jupyter.org/policy": "{}"}),
        "clusterqueues/nlp: metadata.annotations.gpuaas.jupyter.org/policy: differs from "
        "clusterqueues/vision's",
    ),
    (
        # Well-formed objects whose quota file breaks its rules: lending above nominal.
        lambda d: [c for c in d if c["kind"] == "ClusterQueue"][1]["spec"]["resourceGroups"][0][
            "flavors"
        ][0]["resources"][0].update(lendingLimit=9),
        "the quota file they make: tenants.nlp.lending_limit.a100: lending limit 9 is above "
        "the nominal quota 4",
    ),
]


@pytest.mark.parametrize(
    "break_it,message", BAD_IMPORTS, ids=[m.split(": ", 1)[-1][:40] for _, m in BAD_IMPORTS]
)
def test_bad_objects_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, break_it: Any, message: str
) -> None:
    docs = our_objects(capsys, tmp_path)
    if message.startswith("clusterqueues/nlp"):
        # The policy annotation exists only when the policy is not the default.
        for cq in (d for d in docs if d["kind"] == "ClusterQueue"):
            cq["metadata"]["annotations"] = {"gpuaas.jupyter.org/policy": '{"lease_ttl": 30}'}
    break_it(docs)
    code, out, err = run(capsys, "import", write(tmp_path, "objects.yaml", docs))
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("jupyter-gpuaas kueue import: ") and message in err, err


def test_import_names_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    code, out, err = run(capsys, "import", missing)
    assert (code, out) == (2, "")
    assert err == f"jupyter-gpuaas kueue import: {missing}: No such file or directory\n"
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    code, out, err = run(capsys, "import", str(empty))
    assert (code, out) == (2, "")
    assert err == (
        f"jupyter-gpuaas kueue import: {empty}: no ResourceFlavor, Cohort, ClusterQueue "
        "or LocalQueue\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    code, _, err = run(capsys, "import", str(bad))
    assert code == 2 and err.startswith(f"jupyter-gpuaas kueue import: {bad}: not valid YAML")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "change,args,message",
    [
        (
            lambda q: q["tenants"].update(Vision=q["tenants"].pop("vision")),
            [],
            "tenant 'Vision': Kueue's object names are lowercase letters",
        ),
        (
            lambda q: q["tenants"]["nlp"].update(
                preemption={"borrow_within_cohort": "LowerPriority"}
            ),
            [],
            "tenants.nlp.preemption: Kueue refuses borrow_within_cohort LowerPriority with "
            "reclaim_within_cohort Never",
        ),
        (
            lambda q: q["tenants"]["nlp"].update(quota={"h100": 1}),
            [],
            "tenants.nlp.quota.h100: unknown flavor 'h100'",
        ),
        (lambda q: None, ["--flavor-resource", "a100=gpu"], "--flavor-resource a100: 'gpu'"),
        (lambda q: None, ["--namespace", "Users"], "--namespace 'Users'"),
    ],
    ids=["tenant-name", "borrow-without-reclaim", "unknown-flavor", "resource", "namespace"],
)
def test_bad_quotas_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, change: Any, args: list[str], message: str
) -> None:
    quotas = yaml.safe_load(yaml.safe_dump(QUOTAS))
    change(quotas)
    code, out, err = run(capsys, "manifests", write(tmp_path, "q.yaml", [quotas]), *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("jupyter-gpuaas kueue manifests: ") and message in err, err


def test_the_example_quotas(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "manifests", str(TWO_TEAMS))
    assert (code, err) == (0, "")
    assert {d["kind"] for d in yaml.safe_load_all(out)} >= {"ResourceFlavor", "ClusterQueue"}


def test_import_reads_v1beta1_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A cluster that still serves v1beta1 (`cohort`) imports the same; v1beta1's names in a
    v1beta2 object are unknown fields."""
    docs = our_objects(capsys, tmp_path)
    for doc in docs:
        doc["apiVersion"] = "kueue.x-k8s.io/v1beta1"
        if doc["kind"] == "ClusterQueue":
            doc["spec"]["cohort"] = doc["spec"].pop("cohortName")
    code, out, err = run(capsys, "import", write(tmp_path, "v1beta1.yaml", docs))
    assert (code, err) == (0, "")
    assert parse_config(yaml.safe_load(out)) == parse_config(QUOTAS)
    _cq(docs)["apiVersion"] = "kueue.x-k8s.io/v1beta2"
    code, _, err = run(capsys, "import", write(tmp_path, "mixed.yaml", docs))
    assert code == 2
    assert err == "jupyter-gpuaas kueue import: clusterqueues/vision: spec.cohort: unknown field\n"


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_import_of_kueues_default_borrowing_warns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, version: str
) -> None:
    """Kueue's default `whenCanBorrow: MayStopSearch` (v1beta1: `Borrow`), written or left
    out, is on nearly every cluster: it imports, with one warning per ClusterQueue that the
    simulator tries the next flavor before borrowing."""
    docs = our_objects(capsys, tmp_path)
    for doc in docs:
        doc["apiVersion"] = f"kueue.x-k8s.io/{version}"
        if doc["kind"] == "ClusterQueue" and version == "v1beta1":
            doc["spec"]["cohort"] = doc["spec"].pop("cohortName")
    cqs = [d for d in docs if d["kind"] == "ClusterQueue"]
    assert len(cqs) >= 2
    cqs[0]["spec"]["flavorFungibility"]["whenCanBorrow"] = (
        "Borrow" if version == "v1beta1" else "MayStopSearch"
    )
    del cqs[1]["spec"]["flavorFungibility"]["whenCanBorrow"]
    code, out, err = run(capsys, "import", write(tmp_path, "default.yaml", docs))
    assert code == 0
    assert parse_config(yaml.safe_load(out)) == parse_config(QUOTAS)
    lines = err.splitlines()
    assert [line.split(": ")[2] for line in lines] == [
        f"clusterqueues/{cq['metadata']['name']}" for cq in cqs[:2]
    ]
    for line in lines:
        assert line.startswith("jupyter-gpuaas kueue import: warning: ")
        assert "tries the next flavor before borrowing" in line
