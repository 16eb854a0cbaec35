"""The pod of a GPU kernel: PURE functions, tested by dict equality.

`kernel_pod_manifest()` builds the pod that `GpuaasKubernetesProvisioner` (kernels.py)
creates once the gateway admitted the kernel's request: one container running the
kernelspec's command (gateway_provisioners' kernel launcher, which sends the kernel's
connection info back to the server's response address), in the user's image, with the
user's environment and volumes, and the grant applied by `grant_pod()` (the flavor's
resource, node selector and tolerations, pinned to the granted node).

The labels are gateway_provisioners' own (`kernel_id`, `component: kernel`), so its tools
and selectors find the pod, plus this project's.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from .pods import GRANT_ENV, HOSTNAME_LABEL, grant_pod, kueue_labels

COMPONENT = "gpu-kernel"
CONTAINER = "kernel"
#: The server's variables a kernel pod must not inherit: the pod's own identity and
#: service links (the kubelet sets them), the server's PATH (the image sets its own), the
#: sync client's config, and what a grant owns.
DEFAULT_ENV_EXCLUDE = (
    "HOSTNAME",
    "HOME",
    "PATH",
    "KUBERNETES_*",
    "KUBECONFIG*",
    "JPY_PARENT_PID",
    "JPY_SESSION_NAME",
    *GRANT_ENV,
)


def dns_label(name: str) -> str:
    """A pod name of at most 63 characters: a long `<user>-<kernel id>` keeps its end,
    the kernel id, which makes it unique."""
    return name[-63:].lstrip("-.") if len(name) > 63 else name


def kernel_env(
    env: Mapping[str, str],
    exclude: Sequence[str] = DEFAULT_ENV_EXCLUDE,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The user's environment as the kernel pod gets it: `env` (what a local kernel would
    inherit) less the names matching an `exclude` pattern, plus `extra`."""
    out = {k: v for k, v in env.items() if not any(fnmatch.fnmatchcase(k, p) for p in exclude)}
    out.update(extra or {})
    return out


def shared_volumes(
    server_pod: Mapping[str, Any] | None, container: str = "notebook"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The volumes of the user's server pod that a kernel pod can share, and where the
    server's container mounts them: claims and network or host volumes, not the pod's
    own scratch (emptyDir), secrets or service-account tokens (projected)."""
    if not server_pod:
        return [], []
    spec = server_pod.get("spec") or {}
    containers = spec.get("containers") or []
    main = next((c for c in containers if c.get("name") == container), None)
    if main is None and containers:
        main = containers[0]
    shareable = {
        v["name"]: dict(v)
        for v in spec.get("volumes") or []
        if not any(k in v for k in ("emptyDir", "projected", "secret", "downwardAPI"))
    }
    mounts = [dict(m) for m in (main or {}).get("volumeMounts") or [] if m["name"] in shareable]
    used = {m["name"] for m in mounts}
    return [v for name, v in shareable.items() if name in used], mounts


def working_dir(cwd: str | None, volume_mounts: Sequence[Mapping[str, Any]]) -> str | None:
    """`cwd` when a mounted volume holds it (so the notebook's relative paths resolve in
    the pod as on the server), else None: the image's own working directory."""
    if not cwd:
        return None
    for m in volume_mounts:
        root = str(m.get("mountPath") or "").rstrip("/")
        if root and (cwd == root or cwd.startswith(root + "/")):
            return cwd
    return None


def kernel_pod_manifest(
    *,
    name: str,
    kernel_id: str,
    user: str,
    command: Sequence[str],
    image: str,
    request: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    volumes: Sequence[Mapping[str, Any]] = (),
    volume_mounts: Sequence[Mapping[str, Any]] = (),
    node_label: str = HOSTNAME_LABEL,
    service_account: str = "",
    automount_token: bool = False,
    queue: str = "",
    priority_class: str = "",
    lifecycle: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Pod of an admitted GPU kernel (API JSON form); `request` is the gateway's
    admitted request object (in Kueue mode its queued one: Kueue admits the pod).
    `automount_token`: mount the service account's API token (a kernel needs no API
    access, so by default it gets no credentials to leak).
    `queue`: Kueue mode, the tenant's LocalQueue (and `priority_class` its
    WorkloadPriorityClass): Kueue's pod integration gates the pod until it admits it.
    `lifecycle`: the container's (prestop.prestop_lifecycle: SIGTERM held back during a
    preemption warning)."""
    labels = {
        "app": "gateway-provisioners",
        "component": "kernel",
        "kernel_id": kernel_id,
        "app.kubernetes.io/name": "jupyter-gpuaas",
        "app.kubernetes.io/component": COMPONENT,
        **kueue_labels(
            queue,
            user=user,
            kind="kernel",
            priority_class=priority_class,
            request=str(request.get("id") or ""),
        ),
    }
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": list(command),
        "env": [{"name": k, "value": str(v)} for k, v in (env or {}).items()],
        "volumeMounts": [dict(m) for m in volume_mounts],
    }
    if lifecycle:
        container["lifecycle"] = dict(lifecycle)
    wd = working_dir(cwd, volume_mounts)
    if wd:
        container["workingDir"] = wd
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "gpuaas.jupyter.org/user": user,
                # Evicting it would kill the user's kernel, state and all.
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": automount_token,
            "containers": [container],
            "volumes": [dict(v) for v in volumes],
        },
    }
    if service_account:
        pod["spec"]["serviceAccountName"] = service_account
    return grant_pod(
        pod, request=request, flavors=flavors, node_label=node_label, container=CONTAINER
    )
