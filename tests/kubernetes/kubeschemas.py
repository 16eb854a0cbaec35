"""Schema checks of the Kubernetes tests: the Kubernetes OpenAPI schemas (the
kubernetes-validate package, strict: unknown fields are errors), and the ScaledObject and
ProvisioningRequest against those projects' published CRD schemas (vendored under crds/,
made strict the same way). Used by test_manifests.py (the shipped documents) and
test_scaleup.py (what the scaler creates on the real API server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

CRDS = Path(__file__).parent / "crds"
K8S_VERSION = "1.30"


def strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with strict field
    validation: an object with `properties` and no `additionalProperties` takes no
    other field."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.v1alpha1.yaml",
    ("autoscaling.x-k8s.io/v1", "ProvisioningRequest"): (
        "autoscaling.x-k8s.io_provisioningrequests.v1.yaml"
    ),
}


def validate(doc: dict[str, Any]) -> None:
    crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd is None:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return
    schema = yaml.safe_load((CRDS / crd).read_text())["openAPIV3Schema"]
    jsonschema.validate(doc, strict(schema))
