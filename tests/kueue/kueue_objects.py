"""Helpers of the Kueue tests: the pinned Kueue's CRD schemas, strict validation of our
objects against them, and the quota files of every scenario we ship (also read by
tests/kubernetes/test_kueue_objects_server.py, which hands them to the real API server)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from jupyter_gpuaas.admission.config import CONFIG_KEYS, parse_config
from jupyter_gpuaas.admission.model import Config
from jupyter_gpuaas.kubeapi.meta import check_label_key

#: The Kueue this project pins (the real-cluster set-up runs the same one).
KUEUE_MODULE = "sigs.k8s.io/kueue@v0.19.2"
KINDS = ("ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue")
ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIRS = (
    ROOT / "tests" / "scenarios",
    ROOT / "hub_config" / "examples",
    Path("/work/shared/scenarios"),
)


def crd_dir() -> Path:
    """The CRDs of the pinned Kueue in the Go module cache (`go mod download` puts it
    there when it is missing)."""
    cache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(cache) / KUEUE_MODULE / "config" / "components" / "crd" / "bases"
    if not path.is_dir():
        subprocess.run(["go", "mod", "download", KUEUE_MODULE], check=True, cwd="/")
    return path


def load_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """{(version, kind): the CRD version's entry (schema, served, storage)} of our kinds."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for kind in KINDS:
        plural = kind.lower() + "s"
        crd = yaml.safe_load((crd_dir() / f"kueue.x-k8s.io_{plural}.yaml").read_text())
        assert crd["spec"]["names"]["kind"] == kind
        for version in crd["spec"]["versions"]:
            out[(version["name"], kind)] = version
    return out


def strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with strict field
    validation: an object with `properties` and no `additionalProperties` takes no other
    field (`x-kubernetes-*` keys and CEL rules are left to the real server)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


_VALIDATORS: dict[tuple[str, str], jsonschema.Draft7Validator] = {}


def validate(doc: dict[str, Any], crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Raise jsonschema.ValidationError (or kubernetes_validate's) for an object the API
    server would refuse: the CRD's schema for the body, ObjectMeta's for the metadata."""
    group, _, version = doc["apiVersion"].partition("/")
    assert group == "kueue.x-k8s.io", doc["apiVersion"]
    key = (version, doc["kind"])
    if key not in _VALIDATORS:
        schema = strict(crds[key]["schema"]["openAPIV3Schema"])
        _VALIDATORS[key] = jsonschema.Draft7Validator(schema)
    _VALIDATORS[key].validate(doc)
    # The CRD says only `metadata: {type: object}`; names, labels and annotations are
    # checked by the server as any object's: the same ObjectMeta on a ConfigMap.
    for name in doc["metadata"].get("annotations") or {}:
        check_label_key(name, "metadata.annotations")  # the same syntax as a label's
    meta = dict(doc["metadata"])
    meta.setdefault("namespace", "default")
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}, "1.30", strict=True
    )


def quota_part(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in CONFIG_KEYS}


def scenario_files() -> Iterator[Path]:
    for folder in SCENARIO_DIRS:
        if folder.is_dir():
            yield from sorted(p for p in folder.glob("*.yaml"))


def scenario_configs() -> list[tuple[str, dict[str, Any]]]:
    """(name, quota part) of every scenario that has one; the shared folder's too."""
    out = []
    for path in scenario_files():
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "flavors" in data and "tenants" in data:
            out.append((f"{path.parent.name}/{path.name}", quota_part(data)))
    return out


def kueue_refuses(config: Config) -> bool:
    """Kueue's ClusterQueue CEL rule: no borrowWithinCohort without reclaimWithinCohort."""
    return any(
        t.preemption.reclaim_within_cohort == "Never"
        and t.preemption.borrow_within_cohort != "Never"
        for t in config.tenants.values()
    )


def config_of(data: dict[str, Any]) -> Config:
    return parse_config(quota_part(data))
