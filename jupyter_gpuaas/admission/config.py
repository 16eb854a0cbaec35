"""Validate the `flavors`, `tenants` and `policy` blocks (SCENARIO.md) into the core's model.

One parser serves the simulator's scenarios and the gateway's `--quotas` file, so a quota
typo is caught the same way everywhere. It is strict on purpose: an unknown key or a wrong
type is an error that names its dotted path (`tenants.vision.quota.a100`), never something
silently ignored, because a silently ignored `borowing_limit` changes who gets GPUs.

Pure: stdlib only, no I/O. Callers parse YAML/JSON themselves and pass plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jupyter_gpuaas.admission.model import (
    BORROW_WITHIN_COHORT,
    QUEUEING,
    RECLAIM_WITHIN_COHORT,
    WITHIN_TENANT,
    Autoscale,
    Cohort,
    Config,
    Flavor,
    Policy,
    Preemption,
    Tenant,
)
from jupyter_gpuaas.admission.values import (
    SpecError,
    join_key,
    want_bool,
    want_int,
    want_mapping,
    want_name,
    want_number,
)
from jupyter_gpuaas.admission.values import check_keys as _check_keys
from jupyter_gpuaas.admission.values import fail as _fail
from jupyter_gpuaas.admission.values import optional as _optional
from jupyter_gpuaas.admission.values import want_choice as _want_choice

__all__ = [
    "DEFAULT_CULL_WARNING",
    "SpecError",
    "default_cull_warning",
    "join_key",
    "parse_config",
    "want_bool",
    "want_int",
    "want_mapping",
    "want_name",
    "want_number",
]

CONFIG_KEYS = ("flavors", "cohorts", "tenants", "policy")
COHORT_KEYS = ("parent", "quota", "borrowing_limit", "lending_limit", "weight")
FLAVOR_KEYS = ("nodes", "gpus_per_node")
TENANT_KEYS = (
    "cohort",
    "quota",
    "borrowing_limit",
    "lending_limit",
    "weight",
    "queueing",
    "preemption",
    "idle_timeout",
    "reservation_ttl",
    "preemption_grace",
)
PREEMPTION_KEYS = ("within_tenant", "reclaim_within_cohort", "borrow_within_cohort")
POLICY_KEYS = (
    "fair_sharing",
    "idle_timeout",
    "reservation_ttl",
    "autoscale",
    "cull_warning",
    "lease_ttl",
    "preemption_grace",
    "one_head_per_cycle",
)
AUTOSCALE_KEYS = ("max_nodes", "provision_delay", "scale_down_after", "provision")

# The gateway's lead time for a cull warning when its quota file sets none: five minutes,
# time enough to come back and press Keep. The scenario format keeps 0 (no warning), so a
# scenario's event stream says only what it asks for.
DEFAULT_CULL_WARNING = 300.0


def default_cull_warning(config: Config) -> float:
    """The gateway's `policy.cull_warning` when the quota file leaves it out.

    `DEFAULT_CULL_WARNING`, or half the shortest idle timeout (the policy's or a tenant's)
    when that is shorter: a warning only shows when it comes before the cull, so a short
    timeout still gets one, half-way through its idle spell. 0 when nothing is ever culled.
    """
    timeouts = [config.policy.idle_timeout]
    timeouts += [t.idle_timeout for t in config.tenants.values() if t.idle_timeout is not None]
    positive = [t for t in timeouts if t > 0]
    if not positive:
        return 0.0
    return min(DEFAULT_CULL_WARNING, min(positive) / 2)


def parse_config(data: Mapping[str, Any], *, prefix: str = "") -> Config:
    """Build a `Config` from the `flavors`, `tenants` and optional `policy` blocks.

    `data` must hold only those keys. `prefix` is prepended to the dotted paths in errors
    (the gateway passes the name of its quota file's section, if any).
    """
    top = want_mapping(data, prefix)
    _check_keys(top, CONFIG_KEYS, prefix)
    for required in ("flavors", "tenants"):
        if required not in top:
            _fail(join_key(prefix, required), "is required")
    flavors = _parse_flavors(top["flavors"], join_key(prefix, "flavors"))
    tenants = _parse_tenants(top["tenants"], flavors, join_key(prefix, "tenants"))
    cohorts = parse_cohorts(_optional(top, "cohorts"), flavors, tenants, prefix)
    policy = _parse_policy(_optional(top, "policy"), flavors, join_key(prefix, "policy"))
    return Config(flavors=flavors, tenants=tenants, policy=policy, cohorts=cohorts)


def parse_cohorts(
    value: Any, flavors: Mapping[str, Flavor], tenants: Mapping[str, Tenant], prefix: str
) -> dict[str, Cohort]:
    """The `cohorts:` tree. Once it is given, every tenant's cohort must be one of it."""
    if value is None:
        return {}
    key = join_key(prefix, "cohorts")
    block = want_mapping(value, key)
    cohorts: dict[str, Cohort] = {}
    for name, raw in block.items():
        ckey = join_key(key, str(name))
        want_name(name, ckey)
        if name in tenants:
            _fail(ckey, "is named like a tenant: cohort and tenant names must differ")
        spec = want_mapping({} if raw is None else raw, ckey)
        _check_keys(spec, COHORT_KEYS, ckey)
        parent_raw = _optional(spec, "parent")
        parent = None if parent_raw is None else want_name(parent_raw, join_key(ckey, "parent"))
        amounts: dict[str, dict[str, int]] = {}
        for which in ("quota", "borrowing_limit", "lending_limit"):
            wkey = join_key(ckey, which)
            amounts[which] = {}
            raw_block = _optional(spec, which)
            if raw_block is None:
                continue
            if which != "quota" and parent is None:
                _fail(wkey, "a root cohort (no parent) has nothing to lend to or borrow from")
            for flavor, n in want_mapping(raw_block, wkey).items():
                fkey = join_key(wkey, flavor)
                if flavor not in flavors:
                    known = ", ".join(flavors) or "none"
                    _fail(fkey, f"unknown flavor {flavor!r} (flavors: {known})")
                amounts[which][flavor] = want_int(n, fkey)
        weight_raw = _optional(spec, "weight")
        weight = (
            1.0
            if weight_raw is None
            else want_number(weight_raw, join_key(ckey, "weight"), positive=True)
        )
        cohorts[name] = Cohort(
            name=name,
            parent=parent,
            quota=amounts["quota"],
            borrowing_limit=amounts["borrowing_limit"],
            lending_limit=amounts["lending_limit"],
            weight=weight,
        )
    for name, c in cohorts.items():
        pkey = join_key(join_key(key, name), "parent")
        if c.parent is not None and c.parent not in cohorts:
            _fail(pkey, f"unknown cohort {c.parent!r}")
        path = [name]
        up = c.parent
        while up is not None:
            if up in path:
                _fail(pkey, f"makes a cycle: {' -> '.join([*path, up])}")
            path.append(up)
            up = cohorts[up].parent
    if cohorts:
        for t in tenants.values():
            if t.cohort is not None and t.cohort not in cohorts:
                _fail(
                    join_key(prefix, f"tenants.{t.name}.cohort"),
                    f"unknown cohort {t.cohort!r} (cohorts: {', '.join(cohorts)})",
                )
    return cohorts


def _parse_flavors(value: Any, key: str) -> dict[str, Flavor]:
    block = want_mapping(value, key)
    flavors: dict[str, Flavor] = {}
    for name, spec in block.items():
        fkey = join_key(key, name)
        spec = want_mapping(spec, fkey)
        _check_keys(spec, FLAVOR_KEYS, fkey)
        for required in FLAVOR_KEYS:
            if required not in spec:
                _fail(join_key(fkey, required), "is required")
        nodes = want_int(spec["nodes"], join_key(fkey, "nodes"))
        per_node = want_int(spec["gpus_per_node"], join_key(fkey, "gpus_per_node"), minimum=1)
        flavors[name] = Flavor(name=name, nodes=nodes, gpus_per_node=per_node)
    return flavors


def _parse_limits(
    value: Any, quota: Mapping[str, int], key: str, *, lending: bool
) -> dict[str, int]:
    if value is None:
        return {}
    block = want_mapping(value, key)
    limits: dict[str, int] = {}
    for flavor, raw in block.items():
        lkey = join_key(key, flavor)
        if flavor not in quota:
            _fail(lkey, f"flavor {flavor!r} is not in the tenant's quota")
        n = want_int(raw, lkey)
        if lending and n > quota[flavor]:
            _fail(lkey, f"lending limit {n} is above the nominal quota {quota[flavor]}")
        limits[flavor] = n
    return limits


def _parse_tenants(value: Any, flavors: Mapping[str, Flavor], key: str) -> dict[str, Tenant]:
    block = want_mapping(value, key)
    return {
        name: _parse_tenant(name, spec, flavors, join_key(key, name))
        for name, spec in block.items()
    }


def _parse_tenant(name: str, value: Any, flavors: Mapping[str, Flavor], key: str) -> Tenant:
    spec = want_mapping(value, key)
    _check_keys(spec, TENANT_KEYS, key)
    if "quota" not in spec:
        _fail(join_key(key, "quota"), "is required")
    qkey = join_key(key, "quota")
    quota: dict[str, int] = {}
    for flavor, raw in want_mapping(spec["quota"], qkey).items():
        fkey = join_key(qkey, flavor)
        if flavor not in flavors:
            known = ", ".join(flavors) or "none"
            _fail(fkey, f"unknown flavor {flavor!r} (flavors: {known})")
        quota[flavor] = want_int(raw, fkey)

    cohort_raw = _optional(spec, "cohort")
    cohort = None if cohort_raw is None else want_name(cohort_raw, join_key(key, "cohort"))
    limits: dict[str, dict[str, int]] = {}
    for which in ("borrowing_limit", "lending_limit"):
        lkey = join_key(key, which)
        raw = _optional(spec, which)
        limits[which] = _parse_limits(raw, quota, lkey, lending=which == "lending_limit")
        if limits[which] and cohort is None:
            _fail(lkey, "needs a cohort: a tenant without cohort neither borrows nor lends")

    weight_raw = _optional(spec, "weight")
    weight = (
        1.0
        if weight_raw is None
        else want_number(weight_raw, join_key(key, "weight"), positive=True)
    )
    queueing_raw = _optional(spec, "queueing")
    queueing = (
        "BestEffortFIFO"
        if queueing_raw is None
        else _want_choice(queueing_raw, QUEUEING, join_key(key, "queueing"))
    )
    preemption = _parse_preemption(_optional(spec, "preemption"), join_key(key, "preemption"))
    idle_raw = _optional(spec, "idle_timeout")
    ttl_raw = _optional(spec, "reservation_ttl")
    grace_raw = _optional(spec, "preemption_grace")
    return Tenant(
        name=name,
        quota=quota,
        cohort=cohort,
        borrowing_limit=limits["borrowing_limit"],
        lending_limit=limits["lending_limit"],
        weight=weight,
        queueing=queueing,
        preemption=preemption,
        idle_timeout=None
        if idle_raw is None
        else want_number(idle_raw, join_key(key, "idle_timeout")),
        reservation_ttl=None
        if ttl_raw is None
        else want_number(ttl_raw, join_key(key, "reservation_ttl")),
        preemption_grace=None
        if grace_raw is None
        else want_number(grace_raw, join_key(key, "preemption_grace")),
    )


def _parse_preemption(value: Any, key: str) -> Preemption:
    if value is None:
        return Preemption()
    spec = want_mapping(value, key)
    _check_keys(spec, PREEMPTION_KEYS, key)
    choices = {
        "within_tenant": WITHIN_TENANT,
        "reclaim_within_cohort": RECLAIM_WITHIN_COHORT,
        "borrow_within_cohort": BORROW_WITHIN_COHORT,
    }
    values = {
        field: "Never"
        if spec.get(field) is None
        else _want_choice(spec[field], allowed, join_key(key, field))
        for field, allowed in choices.items()
    }
    return Preemption(**values)


def _parse_policy(value: Any, flavors: Mapping[str, Flavor], key: str) -> Policy:
    if value is None:
        return Policy()
    spec = want_mapping(value, key)
    _check_keys(spec, POLICY_KEYS, key)
    numbers: dict[str, float] = {}
    for name in (
        "idle_timeout",
        "reservation_ttl",
        "cull_warning",
        "lease_ttl",
        "preemption_grace",
    ):
        raw = _optional(spec, name)
        if raw is not None:
            numbers[name] = want_number(raw, join_key(key, name))
    fair_raw = _optional(spec, "fair_sharing")
    fair = False if fair_raw is None else want_bool(fair_raw, join_key(key, "fair_sharing"))
    turns_raw = _optional(spec, "one_head_per_cycle")
    turns = (
        False if turns_raw is None else want_bool(turns_raw, join_key(key, "one_head_per_cycle"))
    )
    autoscale = _parse_autoscale(_optional(spec, "autoscale"), flavors, join_key(key, "autoscale"))
    return Policy(
        fair_sharing=fair,
        one_head_per_cycle=turns,
        autoscale=autoscale,
        idle_timeout=numbers.get("idle_timeout", 0.0),
        reservation_ttl=numbers.get("reservation_ttl", 0.0),
        cull_warning=numbers.get("cull_warning", 0.0),
        lease_ttl=numbers.get("lease_ttl", 0.0),
        preemption_grace=numbers.get("preemption_grace", 0.0),
    )


def _parse_autoscale(value: Any, flavors: Mapping[str, Flavor], key: str) -> dict[str, Autoscale]:
    if value is None:
        return {}
    block = want_mapping(value, key)
    out: dict[str, Autoscale] = {}
    for flavor, raw in block.items():
        akey = join_key(key, flavor)
        if flavor not in flavors:
            known = ", ".join(flavors) or "none"
            _fail(akey, f"unknown flavor {flavor!r} (flavors: {known})")
        spec = want_mapping(raw, akey)
        _check_keys(spec, AUTOSCALE_KEYS, akey)
        if "max_nodes" not in spec:
            _fail(join_key(akey, "max_nodes"), "is required")
        max_nodes = want_int(spec["max_nodes"], join_key(akey, "max_nodes"))
        if max_nodes < flavors[flavor].nodes:
            _fail(
                join_key(akey, "max_nodes"),
                f"{max_nodes} is below the flavor's {flavors[flavor].nodes} nodes",
            )
        kwargs: dict[str, Any] = {}
        for name in ("provision_delay", "scale_down_after"):
            if spec.get(name) is not None:
                kwargs[name] = want_number(spec[name], join_key(akey, name))
        if spec.get("provision") is not None:
            kwargs["provision"] = want_bool(spec["provision"], join_key(akey, "provision"))
        out[flavor] = Autoscale(max_nodes=max_nodes, **kwargs)
    return out
