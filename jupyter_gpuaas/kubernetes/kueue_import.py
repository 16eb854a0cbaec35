"""Kueue's objects back as a quota file (PURE: dicts in, dicts out).

`import_objects` reads ResourceFlavors, Cohorts, ClusterQueues and LocalQueues, from our
own `kueue manifests` or from a cluster's `kubectl get -o yaml` (a `List` with `items`,
with the server's metadata, defaults and status), into the quota file's plain data, which
`parse_config` then checks. It is strict, like the quota file's parser: a field Kueue does
not have, or one that the core does not model set to anything but its default (admission
checks, topology-aware scheduling, ...), raises `KueueImportError` naming the object and
the field, because a what-if on quotas that silently dropped an admission check would
answer a different question.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from jupyter_gpuaas.admission.model import (
    BORROW_WITHIN_COHORT,
    QUEUEING,
    RECLAIM_WITHIN_COHORT,
    WITHIN_TENANT,
)

from .kueue import (
    AUTOSCALE,
    FLAVOR_ORDER,
    FUNGIBILITY,
    GPUS_PER_NODE,
    IMPORT_VERSIONS,
    NODES,
    POLICY,
    TENANT_ANNOTATIONS,
    ZERO_QUOTA,
)


class KueueImportError(ValueError):
    """Objects the quota file cannot hold; str() is the one line the CLI prints."""


_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(\d+(\.\d*)?|\.\d+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$"
)


def parse_quantity(value: Any, where: str) -> Decimal:
    """A Kubernetes quantity (`8`, `"8"`, `"1500m"`, `"1e3"`, `"2Ki"`) as a Decimal."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise KueueImportError(f"{where}: {value!r} is not a quantity")
    m = _QUANTITY.match(str(value).strip())
    if m is None:
        raise KueueImportError(f"{where}: {value!r} is not a quantity")
    try:
        number = Decimal(m["num"])
    except InvalidOperation as e:  # pragma: no cover - the pattern admits only decimals
        raise KueueImportError(f"{where}: {value!r} is not a quantity") from e
    suffix = m["suffix"] or ""
    if suffix[:1] in ("e", "E"):
        return number.scaleb(int(suffix[1:]))
    return number * _SUFFIX[suffix]


def _gpus(value: Any, where: str) -> int:
    q = parse_quantity(value, where)
    if q != q.to_integral_value() or q < 0:
        raise KueueImportError(f"{where}: {value!r} is not a whole number of GPUs")
    return int(q)


def _weight(value: Any, where: str) -> float:
    return float(parse_quantity(value, where))


def _seconds(value: Any, where: str) -> float:
    n = float(parse_quantity(value, where))
    return int(n) if n.is_integer() else n


class _Object:
    """One object being read: its name for messages, and strict access to its fields."""

    def __init__(self, obj: Mapping[str, Any], plural: str) -> None:
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            raise KueueImportError(f"{plural}: metadata.name is required")
        self.name: str = meta["name"]
        self.where = f"{plural}/{self.name}"
        notes = meta.get("annotations") or {}
        if not isinstance(notes, Mapping):
            raise KueueImportError(f"{self.where}: metadata.annotations: must be a mapping")
        self.notes: Mapping[str, Any] = notes
        self.obj = obj

    def fail(self, path: str, message: str) -> KueueImportError:
        return KueueImportError(f"{self.where}: {path}: {message}")

    def mapping(self, value: Any, path: str, allowed: Iterable[str]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, "must be a mapping")
        known = set(allowed)
        for key in value:
            if key not in known:
                raise self.fail(f"{path}.{key}", "unknown field")
        return value

    def items(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(path, "must be a list")
        return value

    def only(self, value: Any, path: str, allowed: Iterable[Any], why: str) -> Any:
        """A field the core models at these values only."""
        choices = list(allowed)
        if value not in choices:
            shown = ", ".join(str(c) for c in choices if c is not None) or "absent"
            raise self.fail(path, f"unsupported value {value!r}: {why} (supported: {shown})")
        return value

    def note(self, key: str) -> str | None:
        value = self.notes.get(key)
        if value is not None and not isinstance(value, str):
            raise self.fail(f"metadata.annotations.{key}", "must be a string")
        return value

    def json_note(self, key: str) -> Any:
        text = self.note(key)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as e:
            raise self.fail(f"metadata.annotations.{key}", "is not JSON") from e


_TOP = ("apiVersion", "kind", "metadata", "spec", "status")


def _quotas(
    o: _Object, groups: Any, path: str, flavors_seen: list[str]
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """nominalQuota, borrowingLimit and lendingLimit per flavor of `resourceGroups`."""
    quota: dict[str, int] = {}
    borrowing: dict[str, int] = {}
    lending: dict[str, int] = {}
    for i, group in enumerate(o.items(groups, path)):
        gpath = f"{path}[{i}]"
        g = o.mapping(group, gpath, ("coveredResources", "flavors"))
        covered = o.items(g.get("coveredResources"), f"{gpath}.coveredResources")
        if len(covered) != 1:
            raise o.fail(
                f"{gpath}.coveredResources",
                f"covers {len(covered)} resources: the core models one GPU resource per flavor",
            )
        for j, flavor in enumerate(o.items(g.get("flavors"), f"{gpath}.flavors")):
            fpath = f"{gpath}.flavors[{j}]"
            f = o.mapping(flavor, fpath, ("name", "resources"))
            name = f.get("name")
            if not isinstance(name, str) or not name:
                raise o.fail(f"{fpath}.name", "is required")
            resources = o.items(f.get("resources"), f"{fpath}.resources")
            if len(resources) != 1:
                raise o.fail(f"{fpath}.resources", "must name the group's one covered resource")
            rpath = f"{fpath}.resources[0]"
            r = o.mapping(
                resources[0], rpath, ("name", "nominalQuota", "borrowingLimit", "lendingLimit")
            )
            if r.get("name") != covered[0]:
                raise o.fail(f"{rpath}.name", f"must be the covered resource {covered[0]!r}")
            flavors_seen.append(name)
            quota[name] = _gpus(r.get("nominalQuota", 0), f"{o.where}: {rpath}.nominalQuota")
            if r.get("borrowingLimit") is not None:
                borrowing[name] = _gpus(r["borrowingLimit"], f"{o.where}: {rpath}.borrowingLimit")
            if r.get("lendingLimit") is not None:
                lending[name] = _gpus(r["lendingLimit"], f"{o.where}: {rpath}.lendingLimit")
    return quota, borrowing, lending


def _weight_of(o: _Object, spec: Mapping[str, Any]) -> float:
    fs = o.mapping(spec.get("fairSharing"), "spec.fairSharing", ("weight",))
    if fs.get("weight") is None:
        return 1.0
    return _weight(fs["weight"], f"{o.where}: spec.fairSharing.weight")


def _resource_flavor(o: _Object) -> dict[str, Any]:
    spec = o.mapping(
        o.obj.get("spec"), "spec", ("nodeLabels", "nodeTaints", "tolerations", "topologyName")
    )
    o.only(spec.get("topologyName"), "spec.topologyName", [None], "topology-aware scheduling")
    out: dict[str, Any] = {}
    for key, field in ((NODES, "nodes"), (GPUS_PER_NODE, "gpus_per_node")):
        text = o.note(key)
        if text is None:
            raise o.fail(
                f"metadata.annotations.{key}",
                "is required: Kueue does not know a flavor's nodes; annotate it",
            )
        out[field] = _gpus(text, f"{o.where}: metadata.annotations.{key}")
    return out


def _preemption(o: _Object, spec: Mapping[str, Any]) -> dict[str, str]:
    p = o.mapping(
        spec.get("preemption"),
        "spec.preemption",
        ("withinClusterQueue", "reclaimWithinCohort", "borrowWithinCohort"),
    )
    bwc = o.mapping(
        p.get("borrowWithinCohort"),
        "spec.preemption.borrowWithinCohort",
        ("policy", "maxPriorityThreshold"),
    )
    o.only(
        bwc.get("maxPriorityThreshold"),
        "spec.preemption.borrowWithinCohort.maxPriorityThreshold",
        [None],
        "the core has no priority threshold for preempting while borrowing",
    )
    return {
        "within_tenant": o.only(
            p.get("withinClusterQueue") or "Never",
            "spec.preemption.withinClusterQueue",
            WITHIN_TENANT,
            "not a Kueue policy",
        ),
        "reclaim_within_cohort": o.only(
            p.get("reclaimWithinCohort") or "Never",
            "spec.preemption.reclaimWithinCohort",
            RECLAIM_WITHIN_COHORT,
            "not a Kueue policy",
        ),
        "borrow_within_cohort": o.only(
            bwc.get("policy") or "Never",
            "spec.preemption.borrowWithinCohort.policy",
            BORROW_WITHIN_COHORT,
            "not a Kueue policy",
        ),
    }


_CQ_FIELDS = (
    "namespaceSelector",
    "queueingStrategy",
    "resourceGroups",
    "flavorFungibility",
    "preemption",
    "fairSharing",
    "admissionChecksStrategy",
    "admissionScope",
    "stopPolicy",
)
#: ClusterQueue fields by version (v1beta2 renamed `cohort` and dropped `admissionChecks`).
CQ_FIELDS = {
    "v1beta2": ("cohortName", "concurrentAdmissionPolicy", *_CQ_FIELDS),
    "v1beta1": ("cohort", "admissionChecks", *_CQ_FIELDS),
}


def _cluster_queue(
    o: _Object, version: str, warnings: list[str]
) -> tuple[dict[str, Any], list[str], Any]:
    spec = o.mapping(o.obj.get("spec"), "spec", CQ_FIELDS[version])
    for key, why in (
        ("admissionChecks", "admission checks"),
        ("admissionChecksStrategy", "admission checks"),
        ("concurrentAdmissionPolicy", "concurrent admission"),
    ):
        o.only(spec.get(key) or None, f"spec.{key}", [None], f"the core models no {why}")
    scope = o.mapping(spec.get("admissionScope"), "spec.admissionScope", ("admissionMode",))
    o.only(
        scope.get("admissionMode"),
        "spec.admissionScope.admissionMode",
        [None, "NoAdmissionFairSharing"],
        "the core models no admission fair sharing",
    )
    o.only(spec.get("stopPolicy"), "spec.stopPolicy", [None, "None"], "a held queue")
    fung = o.mapping(
        spec.get("flavorFungibility"),
        "spec.flavorFungibility",
        ("whenCanBorrow", "whenCanPreempt", "preference"),
    )
    for key, value in FUNGIBILITY.items():
        given = fung.get(key)
        if version == "v1beta1" and given == "Borrow":
            given = "MayStopSearch"  # v1beta1's old name of it
        if key == "whenCanBorrow" and given in (None, "MayStopSearch"):
            # Kueue's default, on nearly every cluster: a what-if on it must still run.
            warnings.append(
                f"{o.where}: flavorFungibility.whenCanBorrow is MayStopSearch (Kueue's "
                "default); the simulator tries the next flavor before borrowing "
                "(TryNextFlavor), as the core does"
            )
            continue
        o.only(
            given,
            f"spec.flavorFungibility.{key}",
            [None, value],
            "the core tries flavors as SCENARIO.md's Flavors says",
        )
    o.only(
        fung.get("preference"),
        "spec.flavorFungibility.preference",
        [None],
        "the core tries flavors as SCENARIO.md's Flavors says",
    )
    out: dict[str, Any] = {}
    cohort = spec.get("cohortName" if version == "v1beta2" else "cohort")
    if cohort:
        out["cohort"] = cohort
    seen: list[str] = []
    quota, borrowing, lending = _quotas(o, spec.get("resourceGroups"), "spec.resourceGroups", seen)
    order_note = o.note(FLAVOR_ORDER)
    if order_note is not None:
        order = order_note.split(",") if order_note else []
        if sorted(order) != sorted(seen):
            raise o.fail(
                f"metadata.annotations.{FLAVOR_ORDER}",
                f"names {order_note!r} but the resource groups hold {','.join(seen)!r}",
            )
        seen = order
    out["quota"] = {f: quota[f] for f in seen}
    if borrowing:
        out["borrowing_limit"] = {f: borrowing[f] for f in seen if f in borrowing}
    if lending:
        out["lending_limit"] = {f: lending[f] for f in seen if f in lending}
    weight = _weight_of(o, spec)
    if weight != 1.0:
        out["weight"] = int(weight) if weight.is_integer() else weight
    queueing = o.only(
        spec.get("queueingStrategy"),
        "spec.queueingStrategy",
        [None, *QUEUEING],
        "not a Kueue queueing strategy",
    )
    if queueing is not None and queueing != "BestEffortFIFO":
        out["queueing"] = queueing
    preemption = _preemption(o, spec)
    if any(v != "Never" for v in preemption.values()):
        out["preemption"] = preemption
    for annotation, key in TENANT_ANNOTATIONS.items():
        text = o.note(annotation)
        if text is not None:
            out[key] = _seconds(text, f"{o.where}: metadata.annotations.{annotation}")
    return out, seen, o.json_note(POLICY)


def _cohort(o: _Object) -> dict[str, Any]:
    spec = o.mapping(o.obj.get("spec"), "spec", ("parentName", "resourceGroups", "fairSharing"))
    out: dict[str, Any] = {}
    if spec.get("parentName"):
        out["parent"] = spec["parentName"]
    seen: list[str] = []
    quota, borrowing, lending = _quotas(o, spec.get("resourceGroups"), "spec.resourceGroups", seen)
    zero_note = o.note(ZERO_QUOTA)
    zero = set(zero_note.split(",")) if zero_note else set()
    own = {
        f: n
        for f, n in quota.items()
        if n or f in zero or (f not in borrowing and f not in lending)
    }
    if own:
        out["quota"] = own
    if borrowing:
        out["borrowing_limit"] = borrowing
    if lending:
        out["lending_limit"] = lending
    weight = _weight_of(o, spec)
    if weight != 1.0:
        out["weight"] = int(weight) if weight.is_integer() else weight
    return out


def _local_queue(o: _Object) -> None:
    spec = o.mapping(o.obj.get("spec"), "spec", ("clusterQueue", "fairSharing", "stopPolicy"))
    o.only(spec.get("stopPolicy"), "spec.stopPolicy", [None, "None"], "a held queue")
    weight = _weight_of(o, spec)
    if weight != 1.0:
        raise o.fail("spec.fairSharing.weight", "the core models no admission fair sharing")


_PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "Cohort": "cohorts",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
}


def flatten(docs: Iterable[Any], source: str) -> list[Mapping[str, Any]]:
    """The objects of YAML documents: `List`s (kubectl's `get -o yaml`) opened, empty
    documents skipped."""
    out: list[Mapping[str, Any]] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise KueueImportError(f"{source}: document {i + 1}: not a Kubernetes object")
        if doc.get("kind") == "List" or (doc.get("kind") or "").endswith("List"):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise KueueImportError(f"{source}: document {i + 1}: items: must be a list")
            out.extend(flatten(items, source))
        else:
            out.append(doc)
    return out


def import_objects(
    objects: Iterable[Mapping[str, Any]], warnings: list[str] | None = None
) -> dict[str, Any]:
    """Kueue's objects as a quota file (flavors, cohorts, tenants, policy), unchecked:
    pass it to `parse_config`. What is imported although the simulator will not do it
    the same way is appended to `warnings`, one line per object."""
    if warnings is None:
        warnings = []
    flavors: dict[str, Any] = {}
    autoscale: dict[str, Any] = {}
    cohorts: dict[str, Any] = {}
    tenants: dict[str, Any] = {}
    policies: list[tuple[str, Any]] = []
    for obj in objects:
        kind = obj.get("kind")
        plural = _PLURALS.get(str(kind))
        if plural is None:
            raise KueueImportError(
                f"kind {kind!r}: not a quota object "
                "(ResourceFlavor, Cohort, ClusterQueue or LocalQueue)"
            )
        o = _Object(obj, plural)
        api = obj.get("apiVersion")
        if api not in IMPORT_VERSIONS:
            raise o.fail(
                "apiVersion", f"unsupported value {api!r} (supported: {', '.join(IMPORT_VERSIONS)})"
            )
        for key in obj:
            if key not in _TOP:
                raise o.fail(str(key), "unknown field")
        if kind == "ResourceFlavor":
            flavors[o.name] = _resource_flavor(o)
            auto = o.json_note(AUTOSCALE)
            if auto is not None:
                autoscale[o.name] = auto
        elif kind == "Cohort":
            cohorts[o.name] = _cohort(o)
        elif kind == "ClusterQueue":
            tenant, _, note = _cluster_queue(o, str(api).rsplit("/", 1)[1], warnings)
            tenants[o.name] = tenant
            policies.append((o.where, note))
        else:
            _local_queue(o)
    policy: dict[str, Any] = {}
    if policies:
        first_where, first = policies[0]
        for where, other in policies[1:]:
            if other != first:
                raise KueueImportError(
                    f"{where}: metadata.annotations.{POLICY}: differs from {first_where}'s "
                    "(the policy is one for all tenants)"
                )
        if first is not None:
            if not isinstance(first, Mapping):
                raise KueueImportError(
                    f"{first_where}: metadata.annotations.{POLICY}: must be a mapping"
                )
            policy.update(first)
    if autoscale:
        policy["autoscale"] = autoscale
    out: dict[str, Any] = {"flavors": flavors}
    if cohorts:
        # Kueue makes a Cohort of every cohortName, declared or not; once the tree is
        # declared, the quota file wants every tenant's cohort in it.
        named = [t.get("cohort") for t in tenants.values()]
        named += [c.get("parent") for c in list(cohorts.values())]
        for name in named:
            if name is not None and name not in cohorts:
                cohorts[name] = {}
        out["cohorts"] = cohorts
    out["tenants"] = tenants
    if policy:
        out["policy"] = policy
    return out
