"""The quota file as Kueue's objects (PURE: dicts in, dicts out), and the names both
directions share (kueue_import.py reads the objects back).

`manifests` turns a parsed quota file into the objects of Kueue's `kueue.x-k8s.io/v1beta2`
API (the storage version of the pinned Kueue, v0.19): a ResourceFlavor per flavor, a Cohort
per declared cohort, a ClusterQueue per tenant and a LocalQueue per tenant in the namespace
where the users' pods run. Our words map onto Kueue's one to one (docs/KUEUE.md); what
Kueue cannot express (a flavor's nodes, the idle policy, the grace of a preemption,
autoscale) rides in `gpuaas.jupyter.org/...` annotations, so nothing is lost on the way
back. A flavor's node labels and tolerations are `ClusterFlavor`'s (meta.py), the one
mapping of flavors to nodes that the Kubernetes mode's pods use too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_gpuaas.admission.model import Config, Policy, Tenant

from ..kubeapi.meta import FLAVOR_LABEL, ClusterFlavor, ManifestError

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
#: The versions `import` reads: the served ones of the pinned Kueue.
IMPORT_VERSIONS = (f"{GROUP}/v1beta2", f"{GROUP}/v1beta1")
#: The project's prefix for labels and annotations (FLAVOR_LABEL's).
PREFIX = FLAVOR_LABEL.rsplit("/", 1)[0] + "/"
NODES = PREFIX + "nodes"
GPUS_PER_NODE = PREFIX + "gpus-per-node"
AUTOSCALE = PREFIX + "autoscale"
FLAVOR_ORDER = PREFIX + "flavor-order"
POLICY = PREFIX + "policy"
ZERO_QUOTA = PREFIX + "zero-quota"
#: Tenant settings that Kueue has no field for: annotation -> the quota file's key.
TENANT_ANNOTATIONS = {
    PREFIX + "idle-timeout": "idle_timeout",
    PREFIX + "reservation-ttl": "reservation_ttl",
    PREFIX + "preemption-grace": "preemption_grace",
}
#: What the core does when flavors are tried (SCENARIO.md "Flavors"), said explicitly: a
#: flavor within nominal quota before one that borrows (not Kueue's default for borrowing,
#: `MayStopSearch`, which stops at the first flavor that fits by borrowing).
FUNGIBILITY = {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _number(value: float) -> int | str:
    """A quantity: a whole number as an int, else the shortest decimal that reads back
    as the same float (Kubernetes quantities take `0.5`, `1e-3`)."""
    if float(value).is_integer():
        return int(value)
    return repr(float(value))


def _check_name(name: str, what: str, *, label: bool = False) -> None:
    ok = _DNS_LABEL if label else _DNS_SUBDOMAIN
    if not ok.match(name) or len(name) > (63 if label else 253):
        raise ManifestError(
            f"{what} {name!r}: Kueue's object names are lowercase letters, digits and '-'"
            f" (at most {63 if label else 253})"
        )


def _resource_groups(
    flavors: Sequence[str],
    resource_of: Mapping[str, str],
    quota: Mapping[str, int],
    borrowing: Mapping[str, int],
    lending: Mapping[str, int],
) -> list[dict[str, Any]]:
    """One resource group per extended resource, its flavors in quota order (the order
    Kueue tries them in)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name in flavors:
        res: dict[str, Any] = {"name": resource_of[name], "nominalQuota": quota.get(name, 0)}
        if name in borrowing:
            res["borrowingLimit"] = borrowing[name]
        if name in lending:
            res["lendingLimit"] = lending[name]
        groups.setdefault(resource_of[name], []).append({"name": name, "resources": [res]})
    return [{"coveredResources": [r], "flavors": fl} for r, fl in groups.items()]


def check_expressible(tenant: Tenant) -> None:
    """Raise ManifestError for a tenant that the quota file allows and Kueue's API refuses.

    Kueue's ClusterQueue rejects `borrowWithinCohort` without `reclaimWithinCohort` (its
    candidates are found by the reclaim policy); the core takes the borrowing policy on its
    own (SCENARIO.md's candidates), so there is no Kueue object that means the same.
    """
    p = tenant.preemption
    if p.reclaim_within_cohort == "Never" and p.borrow_within_cohort != "Never":
        raise ManifestError(
            f"tenants.{tenant.name}.preemption: Kueue refuses borrow_within_cohort "
            f"{p.borrow_within_cohort} with reclaim_within_cohort Never "
            "(set reclaim_within_cohort to LowerPriority or Any)"
        )


def _policy_block(policy: Policy) -> dict[str, Any]:
    """The global policy in the quota file's words, defaults left out (autoscale rides on
    the ResourceFlavors)."""
    default = Policy()
    out: dict[str, Any] = {}
    for key in (
        "fair_sharing",
        "idle_timeout",
        "reservation_ttl",
        "cull_warning",
        "lease_ttl",
        "preemption_grace",
        "one_head_per_cycle",
    ):
        value = getattr(policy, key)
        if value != getattr(default, key):
            out[key] = value
    return out


def manifests(
    config: Config, flavors: Sequence[ClusterFlavor], namespace: str
) -> list[dict[str, Any]]:
    """Kueue's objects for a quota file: ResourceFlavors, Cohorts, ClusterQueues, then
    LocalQueues (the order `kubectl apply` needs: what is referred to comes first)."""
    _check_name(namespace, "--namespace", label=True)
    resource_of = {f.name: f.resource for f in flavors}
    docs: list[dict[str, Any]] = []
    for cf in flavors:
        _check_name(cf.name, "flavor")
        fl = config.flavors[cf.name]
        notes = {NODES: str(fl.nodes), GPUS_PER_NODE: str(fl.gpus_per_node)}
        auto = config.policy.autoscale.get(cf.name)
        if auto is not None:
            notes[AUTOSCALE] = json.dumps(
                {
                    "max_nodes": auto.max_nodes,
                    "provision_delay": auto.provision_delay,
                    "scale_down_after": auto.scale_down_after,
                    "provision": auto.provision,
                }
            )
        docs.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceFlavor",
                "metadata": {"name": cf.name, "annotations": notes},
                "spec": {
                    "nodeLabels": dict(cf.node_selector),
                    "tolerations": [dict(t) for t in cf.tolerations],
                },
            }
        )
    for cohort in config.cohorts.values():
        _check_name(cohort.name, "cohort")
        cspec: dict[str, Any] = {}
        if cohort.parent is not None:
            cspec["parentName"] = cohort.parent
        named = [
            f
            for f in config.flavors
            if f in cohort.quota or f in cohort.borrowing_limit or f in cohort.lending_limit
        ]
        if named:
            cspec["resourceGroups"] = _resource_groups(
                named, resource_of, cohort.quota, cohort.borrowing_limit, cohort.lending_limit
            )
        cspec["fairSharing"] = {"weight": _number(cohort.weight)}
        cmeta: dict[str, Any] = {"name": cohort.name}
        # A cohort's own quota of 0 next to a limit would read back as no quota at all.
        zero = [f for f in named if cohort.quota.get(f) == 0]
        if zero:
            cmeta["annotations"] = {ZERO_QUOTA: ",".join(zero)}
        docs.append({"apiVersion": API_VERSION, "kind": "Cohort", "metadata": cmeta, "spec": cspec})
    policy = _policy_block(config.policy)
    for tenant in config.tenants.values():
        _check_name(tenant.name, "tenant", label=True)
        check_expressible(tenant)
        order = list(tenant.quota)
        groups = _resource_groups(
            order, resource_of, tenant.quota, tenant.borrowing_limit, tenant.lending_limit
        )
        notes = {}
        for annotation, key in TENANT_ANNOTATIONS.items():
            value = getattr(tenant, key)
            if value is not None:
                notes[annotation] = str(_number(value))
        if [f["name"] for g in groups for f in g["flavors"]] != order:
            notes[FLAVOR_ORDER] = ",".join(order)
        if policy:
            notes[POLICY] = json.dumps(policy)
        spec: dict[str, Any] = {}
        if tenant.cohort is not None:
            spec["cohortName"] = tenant.cohort
        spec.update(
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "queueingStrategy": tenant.queueing,
                "resourceGroups": groups,
                "flavorFungibility": dict(FUNGIBILITY),
                "preemption": {
                    "withinClusterQueue": tenant.preemption.within_tenant,
                    "reclaimWithinCohort": tenant.preemption.reclaim_within_cohort,
                    "borrowWithinCohort": {"policy": tenant.preemption.borrow_within_cohort},
                },
                "fairSharing": {"weight": _number(tenant.weight)},
            }
        )
        meta: dict[str, Any] = {"name": tenant.name}
        if notes:
            meta["annotations"] = notes
        docs.append(
            {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": meta, "spec": spec}
        )
    for tenant in config.tenants.values():
        docs.append(
            {
                "apiVersion": API_VERSION,
                "kind": "LocalQueue",
                "metadata": {"name": tenant.name, "namespace": namespace},
                "spec": {"clusterQueue": tenant.name},
            }
        )
    return docs
