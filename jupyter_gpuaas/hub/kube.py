"""KubeSpawner behind the queue. Imported only when kubespawner is installed."""

from __future__ import annotations

from typing import Any

from kubespawner import KubeSpawner
from traitlets import Unicode

from .k8s import gpu_pod_settings
from .spawner import QueuedSpawnerMixin


class QueuedKubeSpawner(QueuedSpawnerMixin, KubeSpawner):  # type: ignore[misc]
    """KubeSpawner whose pods get the granted GPUs: `nvidia.com/gpu` (or the flavor's
    resource) limits, the flavor's node selector and tolerations (`flavors` trait)."""

    pin_node_label = Unicode(
        "",
        help="""Node label that pins the pod to the node the gateway granted (e.g.
        kubernetes.io/hostname), when the gateway's inventory names Kubernetes nodes.
        Empty: the scheduler picks any node of the flavor.""",
    ).tag(config=True)

    async def _apply_grant(self, req: dict[str, Any]) -> None:
        grant = req.get("grant") or {}
        settings = gpu_pod_settings(
            gpus=int(req.get("gpus") or 0),
            flavor=grant.get("flavor"),
            flavors=self.flavors,
            node_selector=self.node_selector,
            tolerations=self.tolerations,
            extra_resource_limits=self.extra_resource_limits,
            extra_resource_guarantees=self.extra_resource_guarantees,
            node=grant.get("node"),
            node_label=self.pin_node_label,
        )
        for name, value in settings.items():
            setattr(self, name, value)
