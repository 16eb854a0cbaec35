"""A gateway grant applied to a pod manifest: a PURE function, tested by dict equality.

The input is the pod as the wrapped spawner built it from its configuration (KubeSpawner's
`get_pod_manifest()`, profile overrides included), in the API's JSON form. The output is a
new pod that holds exactly what the grant says, whatever the previous start held:

- every GPU resource (`nvidia.com/gpu`, `nvidia.com/mig-*`, any flavor's resource) is
  removed from every container, so a GPU in the configuration never reaches a pod
  without a grant;
- with a grant of N GPUs of a flavor, the main container requests and limits N of the
  flavor's resource (extended resources cannot be overcommitted: request == limit), the
  pod carries the flavor's node selector and tolerations, and a required node affinity
  on `kubernetes.io/hostname` pins it to the granted node, so the scheduler and the
  device plugin (which sets the container's visible devices) stay in charge;
- without one the main container gets `NVIDIA_VISIBLE_DEVICES=void` (the NVIDIA
  container runtime then mounts no GPU) and, when hiding, `CUDA_VISIBLE_DEVICES=""`.

Nothing is written back into the spawner's traits: the next start begins again from the
configured values, so one start's grant cannot leak into the next.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from jupyter_gpuaas.client import grant_names
from jupyter_gpuaas.kubeapi.meta import DEFAULT_RESOURCE
from jupyter_gpuaas.kubeapi.workloads import (
    KIND_KEY,
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    REQUEST_KEY,
    USER_KEY,
)

HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Annotations that name the gateway request a pod holds (read by people and the inventory).
REQUEST_ANNOTATION = "gpuaas.jupyter.org/request"
TENANT_ANNOTATION = "gpuaas.jupyter.org/tenant"
#: Environment a grant owns: removed from the configured env before the grant's is added.
GRANT_ENV = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPUAAS_REQUEST_ID",
    "GPUAAS_TENANT",
    "GPUAAS_FLAVOR",
    "GPUAAS_NODE",
)


_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def kueue_labels(
    queue: str, *, user: str = "", kind: str = "", priority_class: str = "", request: str = ""
) -> dict[str, str]:
    """The labels that hand a pod or Job to Kueue in Kueue mode (none without `queue`):
    its LocalQueue, its WorkloadPriorityClass when one is named, and who and what it is
    (copied by Kueue onto the Workload, where the gateway reads them; a user name that is
    no valid label value stays in the `gpuaas.jupyter.org/user` annotation only), and the
    id of the holder's request (`request`), to which the gateway binds the Workload."""
    if not queue:
        return {}
    out = {QUEUE_LABEL: queue}
    if priority_class:
        out[PRIORITY_CLASS_LABEL] = priority_class
    if kind:
        out[KIND_KEY] = kind
    if user and _LABEL_VALUE.fullmatch(user):
        out[USER_KEY] = user
    if request:
        out[REQUEST_KEY] = request
    return out


def flavor_resource(flavors: Mapping[str, Mapping[str, Any]], flavor: str | None) -> str:
    """The extended resource that carries a flavor's GPUs (the device plugin's name)."""
    spec = flavors.get(flavor or "") or {}
    return str(spec.get("resource") or DEFAULT_RESOURCE)


def is_gpu_resource(name: str, flavors: Mapping[str, Mapping[str, Any]]) -> bool:
    if name == DEFAULT_RESOURCE or name.startswith("nvidia.com/mig-"):
        return True
    return any(str(spec.get("resource") or "") == name for spec in flavors.values())


def grant_env(request: Mapping[str, Any] | None, *, hide_devices: bool = True) -> dict[str, str]:
    """The environment of a pod for a grant (`None`: a server started with gpus: 0).

    Inside a pod the device plugin, not the gateway, chooses the container's devices and
    sets their indices, so a grant adds only the names of what it is (request, tenant,
    flavor, node).
    """
    if request is None:
        env = {"NVIDIA_VISIBLE_DEVICES": "void"}
        if hide_devices:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env
    return grant_names(request)


def pin_to_node(affinity: Mapping[str, Any] | None, label: str, node: str) -> dict[str, Any]:
    """`affinity` with a required term that only `node` satisfies.

    Node selector terms are ORed and the expressions inside a term ANDed, so the pin is
    added to every configured term (each still has to hold, on the granted node), or
    makes the only term when none is configured.
    """
    out = copy.deepcopy(dict(affinity or {}))
    node_affinity = out.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    pin = {"key": label, "operator": "In", "values": [node]}
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or []), pin]} for term in terms
    ]
    return out


def _main_container(containers: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for container in containers:
        if container.get("name") == name:
            return container
    return containers[0]


def grant_pod(
    pod: Mapping[str, Any],
    *,
    request: Mapping[str, Any] | None,
    flavors: Mapping[str, Mapping[str, Any]],
    node_label: str = HOSTNAME_LABEL,
    container: str = "notebook",
    hide_devices: bool = True,
) -> dict[str, Any]:
    """A copy of `pod` (API JSON form) holding exactly the grant of `request`.

    `request` is the gateway's admitted request object (`gpus`, `tenant`, `grant` with
    `flavor` and `node`), or `None` for a pod that holds no GPU. `node_label` "" leaves
    the pod unpinned (an inventory whose node names are not the cluster's).
    """
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    containers = spec.get("containers") or []
    if not containers:
        raise ValueError("the pod has no container to hand the GPUs to")
    for c in [*containers, *(spec.get("initContainers") or [])]:
        resources = c.get("resources") or {}
        for kind in ("limits", "requests"):
            if resources.get(kind):
                resources[kind] = {
                    k: v for k, v in resources[kind].items() if not is_gpu_resource(k, flavors)
                }
    main = _main_container(containers, container)
    env = [e for e in main.get("env") or [] if e.get("name") not in GRANT_ENV]
    gpus = int((request or {}).get("gpus") or 0)
    if request is None or gpus <= 0:
        main["env"] = env + [
            {"name": k, "value": v} for k, v in grant_env(None, hide_devices=hide_devices).items()
        ]
        return out
    grant = request.get("grant") or {}
    flavor = grant.get("flavor") or request.get("flavor")
    fspec = flavors.get(flavor or "") or {}
    resource = flavor_resource(flavors, flavor)
    resources = main.setdefault("resources", {})
    for kind in ("limits", "requests"):
        resources[kind] = {**(resources.get(kind) or {}), resource: str(gpus)}
    main["env"] = env + [{"name": k, "value": v} for k, v in grant_env(request).items()]
    selector = {**(spec.get("nodeSelector") or {}), **(fspec.get("node_selector") or {})}
    if selector:
        spec["nodeSelector"] = selector
    tolerations = [dict(t) for t in spec.get("tolerations") or []]
    for tol in fspec.get("tolerations") or []:
        if dict(tol) not in tolerations:
            tolerations.append(dict(tol))
    if tolerations:
        spec["tolerations"] = tolerations
    node = grant.get("node")
    if node_label and node:
        spec["affinity"] = pin_to_node(spec.get("affinity"), node_label, str(node))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        REQUEST_ANNOTATION: str(request.get("id") or ""),
        TENANT_ANNOTATION: str(request.get("tenant") or ""),
    }
    return out
