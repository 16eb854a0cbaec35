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
- **ProvisioningRequest** (`--scale-up provisioning-request`): per capacity-blocked head,
  an `autoscaling.x-k8s.io/v1` ProvisioningRequest of one pod (podSets count 1) whose
  PodTemplate is shaped like that blocked request: exactly its GPUs of the flavor's
  resource, the flavor's node selector and tolerations (class
  `check-capacity.autoscaling.x-k8s.io`, or `best-effort-atomic-scale-up.autoscaling.x-k8s.io`).
  The gateway's scaler creates them as heads block and deletes them (request and template)
  once the head is admitted, cancelled or gone; the manifests ship one example per flavor.

Placeholders and KEDA size by whole nodes (`gpuaas_desired_nodes{flavor}`): a placeholder
stands for a node the queue wants. A ProvisioningRequest stands for one blocked request:
the autoscaler then picks the node that holds it, and packs other heads beside it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .connect import api_client
from .meta import FLAVOR_LABEL, ClusterFlavor, ManifestError, Settings, labels, meta

log = logging.getLogger("jupyter_gpuaas.kubeapi.scaleup")

PLACEHOLDER_PRIORITY = "jupyter-gpuaas-placeholder"
REQUEST_KEY = "gpuaas.jupyter.org/request"  # the head's request id, on its scale-up objects
#: A capacity-blocked head as the gateway's scaler hands it over: (request id, flavor, GPUs).
Head = tuple[str, str, int]
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
            # What the gateway creates for a blocked head of one GPU of the flavor (it
            # makes one per head, with that head's GPUs): a template to read or apply.
            name = f"jupyter-gpuaas-example-{f.name}"
            docs.append(pod_template(name, f, 1, settings))
            docs.append(provisioning_request(name, name, 1, settings))
        return docs
    docs = [priority_class(settings)] + [placeholder_deployment(f, settings) for f in grown]
    if settings.scale_up == "keda":
        docs += [scaled_object(f, settings) for f in grown]
    return docs


# --------------------------------------------------------------------- at run time


def _dns(text: str, limit: int) -> str:
    """`text` as a DNS label / label value: lowercase, other characters as '-'."""
    out = "".join(c if c.isalnum() and c.isascii() else "-" for c in text.lower())
    return out[:limit].strip("-.") or "x"


def head_name(flavor: str, rid: str) -> str:
    """The name of a head's PodTemplate and ProvisioningRequest: the same for the same
    head in every gateway replica, so a new leader finds its predecessor's objects."""
    return _dns(f"jupyter-gpuaas-{flavor}-{rid}", 253)


def head_objects(
    head: Head, flavor: ClusterFlavor, settings: Settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The PodTemplate and ProvisioningRequest of one capacity-blocked head: one pod
    asking for exactly the head's GPUs of the flavor's resource, on the flavor's nodes."""
    rid, _, gpus = head
    name = head_name(flavor.name, rid)
    extra = {FLAVOR_LABEL: flavor.name, REQUEST_KEY: _dns(rid, 63)}
    template = pod_template(name, flavor, gpus, settings, extra)
    request = provisioning_request(name, name, 1, settings, extra)
    return template, request


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


class ProvisioningRequests:
    """One ProvisioningRequest (and its PodTemplate) per capacity-blocked head.

    `sync(heads)` makes the cluster's objects say what the queue is blocked on: a head
    without objects gets them, shaped like it (its GPUs, not a whole node's); objects whose
    head is no longer blocked (admitted on the Node that joined, cancelled, ended) are
    deleted. Names come from the head, so a new leader adopts the objects its predecessor
    made and deletes those it no longer wants.
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
        self.current: set[str] = set()  # names of the heads' objects, as of the last sync
        self._client: Any = None

    async def _apis(self) -> tuple[Any, Any]:
        from kubernetes_asyncio import client

        if self._client is None:
            self._client = await api_client()
        return client.CoreV1Api(self._client), client.CustomObjectsApi(self._client)

    def wanted(self, heads: Sequence[Head]) -> dict[str, Head]:
        """The objects `heads` call for, by name (heads of flavors not scaled: none)."""
        return {
            head_name(flavor, rid): (rid, flavor, gpus)
            for rid, flavor, gpus in heads
            if flavor in self.flavors and gpus > 0
        }

    async def sync(self, heads: Sequence[Head]) -> None:
        core, custom = await self._apis()
        ns = self.settings.namespace
        # What is there, read each time: a leader that took over (again) finds the
        # objects its predecessor made, keeps those of heads still blocked, and deletes
        # the rest; syncs come only when the blocked heads change.
        self.current, stray = await self._existing(core, custom)
        want = self.wanted(heads)
        for name in sorted((self.current - set(want)) | stray):
            await self._delete(core, custom, name)
            self.current.discard(name)
            log.info("ProvisioningRequest %s deleted: its request no longer waits for a node", name)
        for name, head in want.items():
            if name in self.current:
                continue
            template, request = head_objects(head, self.flavors[head[1]], self.settings)
            await _created(core.create_namespaced_pod_template(ns, template))
            await _created(
                custom.create_namespaced_custom_object(
                    self.group, self.version, ns, self.plural, request
                )
            )
            self.current.add(name)
            rid, flavor, gpus = head
            log.info(
                "ProvisioningRequest %s created: request %s waits for a node with %d %s GPU%s",
                name,
                rid,
                gpus,
                flavor,
                "" if gpus == 1 else "s",
            )

    async def _existing(self, core: Any, custom: Any) -> tuple[set[str], set[str]]:
        """Heads' objects already in the namespace (carrying a head's request label),
        whoever made them: the names with both a request and its template, and the
        names with only one (a gateway stopped between the two creates), to delete."""
        ns = self.settings.namespace
        selector = f"app.kubernetes.io/name=jupyter-gpuaas,{REQUEST_KEY}"
        requests = await custom.list_namespaced_custom_object(
            self.group, self.version, ns, self.plural, label_selector=selector
        )
        templates = await core.list_namespaced_pod_template(ns, label_selector=selector)
        made = {r["metadata"]["name"] for r in requests.get("items") or []}
        templated = {t.metadata.name for t in templates.items or []}
        return made & templated, made ^ templated

    async def _delete(self, core: Any, custom: Any, name: str) -> None:
        ns = self.settings.namespace
        await _deleted(
            custom.delete_namespaced_custom_object(self.group, self.version, ns, self.plural, name)
        )
        await _deleted(core.delete_namespaced_pod_template(name, ns))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


async def _created(call: Any) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        await call
    except ApiException as e:
        if e.status != 409:  # there already: made for this head by an earlier leader
            raise


async def _deleted(call: Any) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        await call
    except ApiException as e:
        if e.status != 404:  # gone already: what we wanted
            raise


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
            self._client = await api_client()
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
