"""Scale-up objects that end in a new Node: PURE builders (tested by dict equality).

Demand that quota admits but capacity cannot place (`gpuaas_desired_nodes{flavor}`) becomes
one of:

- **placeholders** (`--scale-up placeholders` or `keda`): per autoscaled flavor, a Deployment
  of pause pods at a negative PriorityClass, each asking for one whole node's GPUs of the
  flavor. The cluster autoscaler adds a node for each pending placeholder; a real GPU pod
  preempts a placeholder at once (z2jh's user-placeholder technique).
- **KEDA** (`--scale-up keda`): a ScaledObject per flavor sets the placeholders' replicas from
  the gateway's own metrics through a prometheus trigger: the nodes wanted beyond those
  the gateway already places on, `gpuaas_desired_nodes{flavor}` minus
  `gpuaas_nodes{flavor}`.
- **ProvisioningRequest** (`--scale-up provisioning-request`): an
  `autoscaling.x-k8s.io/v1` ProvisioningRequest with a PodTemplate shaped like the blocked
  request (class `check-capacity.autoscaling.x-k8s.io`, or
  `best-effort-atomic-scale-up.autoscaling.x-k8s.io`); the manifests ship one example per
  flavor, the gateway's scaler creates and deletes them per capacity-blocked head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .meta import ClusterFlavor, ManifestError, Settings, labels, meta

PLACEHOLDER_PRIORITY = "jupyter-gpuaas-placeholder"
CLASSES = (
    "check-capacity.autoscaling.x-k8s.io",
    "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
)


def placeholder_name(flavor: str) -> str:
    return f"jupyter-gpuaas-placeholder-{flavor}"


def priority_class(settings: Settings) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": meta(PLACEHOLDER_PRIORITY, "placeholder", settings, namespaced=False),
        # Below every real pod (0 by default): any GPU pod preempts a placeholder.
        "value": -10,
        "globalDefault": False,
        # A placeholder never evicts anything itself: it only waits for a new node.
        "preemptionPolicy": "Never",
        "description": "jupyter-gpuaas placeholders: hold room for queued GPU requests; "
        "real pods preempt them.",
    }


def gpu_pod_spec(
    flavor: ClusterFlavor, gpus: int, image: str, *, priority_class_name: str = ""
) -> dict[str, Any]:
    """A pod asking for `gpus` of the flavor on the flavor's nodes: what the scheduler and
    the cluster autoscaler look at (selector, tolerations, the extended resource)."""
    amount = {flavor.resource: str(gpus)}
    spec: dict[str, Any] = {
        "nodeSelector": dict(flavor.node_selector),
        "tolerations": [dict(t) for t in flavor.tolerations],
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "pause",
                "image": image,
                "resources": {"requests": dict(amount), "limits": dict(amount)},
            }
        ],
    }
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    return spec


def placeholder_deployment(flavor: ClusterFlavor, settings: Settings) -> dict[str, Any]:
    component = "placeholder"
    select = {
        "app.kubernetes.io/name": "jupyter-gpuaas",
        "gpuaas.jupyter.org/placeholder": flavor.name,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(placeholder_name(flavor.name), component, settings),
        "spec": {
            "replicas": 0,  # set by KEDA, or by the gateway's placeholder scaler
            "selector": {"matchLabels": select},
            "template": {
                "metadata": {"labels": {**labels(component, settings), **select}},
                "spec": gpu_pod_spec(
                    flavor,
                    flavor.gpus_per_node,  # one placeholder holds one whole node
                    settings.placeholder_image,
                    priority_class_name=PLACEHOLDER_PRIORITY,
                ),
            },
        },
    }


def nodes_wanted_query(flavor: str) -> str:
    """PromQL: the flavor's nodes wanted beyond those the gateway already places on.

    Only the leader exports these gauges (a standby exports none, gateway/metrics.py), so
    `max` over every scraped replica is the leader's value, and stays so while a failover
    briefly leaves the old leader's last sample next to the new leader's.
    """
    want = f'max(gpuaas_desired_nodes{{flavor="{flavor}"}})'
    have = f'max(gpuaas_nodes{{flavor="{flavor}"}})'
    return f"clamp_min({want} - ({have} or vector(0)), 0)"


def scaled_object(flavor: ClusterFlavor, settings: Settings) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta(placeholder_name(flavor.name), "placeholder", settings),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": placeholder_name(flavor.name),
            },
            "minReplicaCount": 0,
            "maxReplicaCount": flavor.growth,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "triggers": [
                {
                    "type": "prometheus",
                    "name": f"gpuaas-desired-nodes-{flavor.name}",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": settings.prometheus_url,
                        "query": nodes_wanted_query(flavor.name),
                        # AverageValue 1: one placeholder replica per node wanted.
                        "threshold": "1",
                        "activationThreshold": "0",
                        # No series at all means the scrape failed (the gateway or the
                        # Hub checking its token is down), not "no demand": an error
                        # keeps the placeholders as they are rather than reading 0.
                        "ignoreNullValues": "false",
                    },
                }
            ],
        },
    }


def pod_template(
    name: str,
    flavor: ClusterFlavor,
    gpus: int,
    settings: Settings,
    extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    m = meta(name, "scale-up", settings)
    m["labels"].update(extra or {})
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": m,
        "template": {
            "metadata": {"labels": dict(m["labels"])},
            "spec": gpu_pod_spec(flavor, gpus, settings.placeholder_image),
        },
    }


def provisioning_request(
    name: str, template: str, count: int, settings: Settings, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    m = meta(name, "scale-up", settings)
    m["labels"].update(extra or {})
    spec: dict[str, Any] = {
        "provisioningClassName": settings.provisioning_class,
        "podSets": [{"count": count, "podTemplateRef": {"name": template}}],
    }
    if settings.provisioning_class == CLASSES[1]:
        spec["parameters"] = {"ValidUntilSeconds": "3600"}
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": m,
        "spec": spec,
    }


def scale_up_objects(flavors: Sequence[ClusterFlavor], settings: Settings) -> list[dict[str, Any]]:
    if settings.scale_up == "none":
        return []
    grown = [f for f in flavors if f.growth > 0]
    if not grown:
        raise ManifestError(
            f"--scale-up {settings.scale_up}: no flavor may grow (policy.autoscale.<flavor>."
            "max_nodes above its nodes in the quota file), so there is nothing to scale; "
            "use --scale-up none"
        )
    if settings.scale_up == "provisioning-request":
        if settings.provisioning_class not in CLASSES:
            raise ManifestError(
                f"--provisioning-class: {settings.provisioning_class!r} is not one of "
                + ", ".join(CLASSES)
            )
        docs = []
        for f in grown:
            name = f"jupyter-gpuaas-example-{f.name}"
            docs.append(pod_template(name, f, f.gpus_per_node, settings))
            docs.append(provisioning_request(name, name, 1, settings))
        return docs
    docs = [priority_class(settings)] + [placeholder_deployment(f, settings) for f in grown]
    if settings.scale_up == "keda":
        docs += [scaled_object(f, settings) for f in grown]
    return docs


# --------------------------------------------------------------------- at run time


def wanted_nodes(desired: Mapping[str, int], ready: Mapping[str, int]) -> dict[str, int]:
    """Nodes per flavor a scale-up should add: what the queue needs beyond what joined."""
    return {f: max(0, n - ready.get(f, 0)) for f, n in desired.items()}


def flavor_from_config(name: str, spec: Mapping[str, Any]) -> ClusterFlavor:
    """A ClusterFlavor from the gateway config's flavor entry (with gpus_per_node)."""
    return ClusterFlavor(
        name=name,
        gpus_per_node=int(spec.get("gpus_per_node") or 1),
        node_selector=dict(spec.get("node_selector") or {}),
        resource=str(spec.get("resource") or "nvidia.com/gpu"),
        tolerations=tuple(dict(t) for t in spec.get("tolerations") or ()),
    )


async def _api_client() -> Any:
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()


class ProvisioningRequests:
    """One ProvisioningRequest (and its PodTemplate) per flavor that needs nodes.

    `apply(wanted)` makes the cluster's objects say what the queue wants: a flavor that
    wants N more nodes has a request for N pods shaped like a whole node of it; when that
    changes the request is replaced (its spec is immutable), and when the flavor wants
    none (its Node joined, the head was admitted) the request and template are deleted.
    """

    group, version, plural = "autoscaling.x-k8s.io", "v1", "provisioningrequests"

    def __init__(
        self,
        flavors: Mapping[str, Mapping[str, Any]],
        *,
        namespace: str,
        provisioning_class: str = CLASSES[0],
    ) -> None:
        if provisioning_class not in CLASSES:
            raise ValueError(f"provisioning_class must be one of {', '.join(CLASSES)}")
        self.flavors = {n: flavor_from_config(n, s) for n, s in flavors.items()}
        self.settings = Settings(namespace=namespace, provisioning_class=provisioning_class)
        self.current: dict[str, tuple[str, int]] = {}  # flavor → (object name, count)
        self._client: Any = None
        self._serial = 0

    async def _apis(self) -> tuple[Any, Any]:
        from kubernetes_asyncio import client

        if self._client is None:
            self._client = await _api_client()
        return client.CoreV1Api(self._client), client.CustomObjectsApi(self._client)

    async def apply(self, wanted: Mapping[str, int]) -> None:
        core, custom = await self._apis()
        ns = self.settings.namespace
        for flavor, count in wanted.items():
            if flavor not in self.flavors:
                continue
            have = self.current.get(flavor)
            if have is not None and have[1] == count:
                continue
            if have is not None:
                await self._delete(core, custom, have[0])
                del self.current[flavor]
            if count > 0:
                self._serial += 1
                name = f"jupyter-gpuaas-{flavor}-{self._serial}"
                extra = {"gpuaas.jupyter.org/flavor": flavor}
                spec = self.flavors[flavor]
                template = pod_template(name, spec, spec.gpus_per_node, self.settings, extra)
                await core.create_namespaced_pod_template(ns, template)
                request = provisioning_request(name, name, count, self.settings, extra)
                await custom.create_namespaced_custom_object(
                    self.group, self.version, ns, self.plural, request
                )
                self.current[flavor] = (name, count)

    async def _delete(self, core: Any, custom: Any, name: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        ns = self.settings.namespace
        for call in (
            lambda: custom.delete_namespaced_custom_object(
                self.group, self.version, ns, self.plural, name
            ),
            lambda: core.delete_namespaced_pod_template(name, ns),
        ):
            try:
                await call()  # type: ignore[no-untyped-call]
            except ApiException as e:
                if e.status != 404:  # gone already: what we wanted
                    raise

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


class Placeholders:
    """Sets the placeholder Deployments' replicas (one per node wanted) through their
    scale subresource; the Deployments themselves come from the manifests."""

    def __init__(
        self, flavors: Mapping[str, Mapping[str, Any]], *, namespace: str, **_: Any
    ) -> None:
        self.flavors = set(flavors)
        self.settings = Settings(namespace=namespace)
        self._client: Any = None

    async def apply(self, wanted: Mapping[str, int]) -> None:
        from kubernetes_asyncio import client

        if self._client is None:
            self._client = await _api_client()
        apps = client.AppsV1Api(self._client)
        for flavor, count in wanted.items():
            if flavor in self.flavors:
                await apps.patch_namespaced_deployment_scale(
                    placeholder_name(flavor), self.settings.namespace, {"spec": {"replicas": count}}
                )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
