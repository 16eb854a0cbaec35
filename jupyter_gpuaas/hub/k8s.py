"""The spawners' `flavors` config, validated (PURE; no Kubernetes import).

A flavor (a pool of identical GPU nodes) names the device plugin's extended resource
(`nvidia.com/gpu`, or a MIG resource such as `nvidia.com/mig-1g.10gb`), the node selector
that lands a pod on the flavor's nodes and the tolerations of their taints. The pods
themselves are built from this and the grant in `jupyter_gpuaas.kubernetes.pods`, on every
start, so nothing of one grant is left in the spawner's traits for the next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: The keys a flavor may carry in `QueuedSpawnerMixin.flavors`.
FLAVOR_KEYS = ("display_name", "description", "resource", "node_selector", "tolerations")


def validate_flavors(flavors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Check the flavors config; raise ValueError naming the key and the problem."""
    out: dict[str, dict[str, Any]] = {}
    for name, spec in flavors.items():
        key = f"flavors.{name}"
        if not isinstance(name, str) or not name:
            raise ValueError(f"{key}: a flavor name must be a non-empty string")
        if not isinstance(spec, Mapping):
            raise ValueError(f"{key}: must be a mapping")
        unknown = sorted(set(spec) - set(FLAVOR_KEYS))
        if unknown:
            raise ValueError(f"{key}: unknown key(s) {', '.join(unknown)}")
        for text in ("display_name", "description", "resource"):
            if text in spec and not isinstance(spec[text], str):
                raise ValueError(f"{key}.{text}: must be a string")
        selector = spec.get("node_selector", {})
        if not isinstance(selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
        ):
            raise ValueError(f"{key}.node_selector: must map label names to string values")
        tolerations = spec.get("tolerations", [])
        if not isinstance(tolerations, Sequence) or not all(
            isinstance(t, Mapping) for t in tolerations
        ):
            raise ValueError(f"{key}.tolerations: must be a list of toleration mappings")
        out[name] = dict(spec)
    return out
