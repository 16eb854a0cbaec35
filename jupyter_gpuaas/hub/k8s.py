"""Kubernetes pod settings for a granted GPU request: a PURE function, like KubeSpawner's
objects.py, so it is tested by dict equality without an API server.

The grant names a flavor (a pool of identical GPU nodes). A pod gets the GPUs through the
device plugin's extended resource (`nvidia.com/gpu`, or a MIG resource such as
`nvidia.com/mig-1g.10gb`) as limits and guarantees, lands on the flavor's nodes through its
node selector, and tolerates the taints that keep other pods off those nodes. The device
plugin, not us, sets CUDA_VISIBLE_DEVICES inside the container; pinning to the granted node
is optional because the gateway's node names are Kubernetes node names only when its
inventory comes from the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_RESOURCE = "nvidia.com/gpu"

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


def gpu_pod_settings(
    *,
    gpus: int,
    flavor: str | None,
    flavors: Mapping[str, Mapping[str, Any]],
    node_selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    extra_resource_limits: Mapping[str, str],
    extra_resource_guarantees: Mapping[str, str],
    node: str | None = None,
    node_label: str = "",
) -> dict[str, Any]:
    """The KubeSpawner trait values for a pod holding `gpus` GPUs of `flavor`.

    Returns new values for `extra_resource_limits`, `extra_resource_guarantees`,
    `node_selector` and `tolerations` (the inputs are the configured values, kept and
    extended, never mutated). With `gpus == 0` the pod gets no GPU resource at all, and the
    flavor is ignored. `node_label` (e.g. `kubernetes.io/hostname`) with `node` pins the pod
    to the node the gateway granted.
    """
    limits = dict(extra_resource_limits)
    guarantees = dict(extra_resource_guarantees)
    selector = dict(node_selector)
    tols = [dict(t) for t in tolerations]
    if gpus > 0:
        spec = flavors.get(flavor or "", {})
        resource = str(spec.get("resource") or DEFAULT_RESOURCE)
        # Extended resources cannot be overcommitted: limit and request must be equal.
        limits[resource] = str(gpus)
        guarantees[resource] = str(gpus)
        selector.update(spec.get("node_selector") or {})
        for tol in spec.get("tolerations") or []:
            if dict(tol) not in tols:
                tols.append(dict(tol))
        if node_label and node:
            selector[node_label] = node
    return {
        "extra_resource_limits": limits,
        "extra_resource_guarantees": guarantees,
        "node_selector": selector,
        "tolerations": tols,
    }
