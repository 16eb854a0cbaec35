"""The pieces every deployment object shares: names, labels, settings, the flavors as the
cluster knows them (PURE)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas._version import __version__
from jupyter_gpuaas.admission.model import Config

#: The extended resource of a flavor that names none: a whole NVIDIA GPU.
DEFAULT_RESOURCE = "nvidia.com/gpu"
NAME = "jupyter-gpuaas"
PART_OF = "jupyterhub"
PORT = 8765
SERVICE_PREFIX = "/services/gpuaas/"
HEALTH_PATH = SERVICE_PREFIX + "api/health"
CONFIG_DIR = "/etc/jupyter-gpuaas"
#: The label a node pool carries when no selector is configured for its flavor.
FLAVOR_LABEL = "gpuaas.jupyter.org/flavor"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SCALE_UPS = ("keda", "provisioning-request", "placeholders", "none")

_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^(({_DNS_SUBDOMAIN})/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
_RESOURCE = re.compile(rf"^{_DNS_SUBDOMAIN}/{_LABEL_NAME}$")


class ManifestError(ValueError):
    """Bad input for the manifests; str() is the one line the CLI prints."""


@dataclass(frozen=True)
class ClusterFlavor:
    """A flavor as the cluster knows it: which Nodes, which extended resource."""

    name: str
    gpus_per_node: int
    node_selector: Mapping[str, str]
    resource: str = DEFAULT_RESOURCE
    tolerations: Sequence[Mapping[str, str]] = (GPU_TOLERATION,)
    nodes: int = 0  # the quota file's nodes of the flavor
    max_nodes: int = 0  # policy.autoscale.max_nodes; 0: not autoscaled

    @property
    def growth(self) -> int:
        """The most nodes a scale-up may add to the pool."""
        return max(0, self.max_nodes - self.nodes)

    def inventory_json(self) -> dict[str, Any]:
        """The flavor in the gateway's and the spawners' `flavors` config format."""
        return {
            "node_selector": dict(self.node_selector),
            "resource": self.resource,
            "tolerations": [dict(t) for t in self.tolerations],
        }


@dataclass(frozen=True)
class Settings:
    namespace: str = "jhub"
    image: str = f"ghcr.io/jupyter-gpuaas/jupyter-gpuaas:{__version__}"
    scale_up: str = "keda"
    admission: str = "core"  # or "kueue": Kueue decides (the gateway's Kueue mode)
    hub_api_url: str = "http://hub:8081/hub/api"
    prometheus_url: str = "http://prometheus-server.monitoring.svc:80"
    db_secret: str = "jupyter-gpuaas-db"  # key `url`: postgresql+psycopg://...
    # keys `token` (the gpuaas service's API token) and `cookie-secret` (the login key)
    hub_token_secret: str = "jupyter-gpuaas-hub"
    provisioning_class: str = "check-capacity.autoscaling.x-k8s.io"
    placeholder_image: str = "registry.k8s.io/pause:3.10"
    quotas_text: str = ""
    # What the users' servers may do with the API: kernels, kernels-and-jobs, none.
    singleuser_access: str = "kernels"
    extra_labels: Mapping[str, str] = field(default_factory=dict)


def check_label_key(key: str, where: str) -> None:
    if not _LABEL_KEY.match(key) or len(key) > 316:
        raise ManifestError(f"{where}: {key!r} is not a valid Kubernetes label name")


def cluster_flavors(
    config: Config,
    selectors: Mapping[str, Mapping[str, str]],
    resources: Mapping[str, str],
) -> list[ClusterFlavor]:
    """The quota file's flavors with their node selectors and resources (checked)."""
    for flag, given in (("--flavor-selector", selectors), ("--flavor-resource", resources)):
        for name in given:
            if name not in config.flavors:
                known = ", ".join(config.flavors) or "none"
                raise ManifestError(
                    f"{flag} {name}: unknown flavor {name!r} (the quota file's flavors: {known})"
                )
    out = []
    for name, flavor in config.flavors.items():
        selector = dict(selectors.get(name) or {FLAVOR_LABEL: name})
        for key, value in selector.items():
            check_label_key(key, f"--flavor-selector {name}")
            if not _LABEL_VALUE.match(value):
                raise ManifestError(
                    f"--flavor-selector {name}: {value!r} is not a valid label value for {key}"
                )
        resource = resources.get(name, DEFAULT_RESOURCE)
        if not _RESOURCE.match(resource):
            raise ManifestError(
                f"--flavor-resource {name}: {resource!r} is not an extended resource name "
                "(like nvidia.com/gpu or nvidia.com/mig-1g.10gb)"
            )
        auto = config.policy.autoscale.get(name)
        out.append(
            ClusterFlavor(
                name=name,
                gpus_per_node=flavor.gpus_per_node,
                node_selector=selector,
                resource=resource,
                nodes=flavor.nodes,
                max_nodes=auto.max_nodes if auto is not None else 0,
            )
        )
    return out


def labels(component: str, settings: Settings) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/version": __version__,
        **settings.extra_labels,
    }


def selector_labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": component}


def meta(name: str, component: str, settings: Settings, namespaced: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if namespaced:
        out["namespace"] = settings.namespace
    out["labels"] = labels(component, settings)
    return out
