"""Invariants of a simulator run, checked by replaying its events against SCENARIO.md.

The conformance scenarios pin a handful of expectations each; these invariants are what
must hold for *every* run, so the property tests can throw random scenarios at the core
and still know when it is wrong. The replay trusts nothing but the event stream and the
scenario itself: it rebuilds nodes, bound devices, quota usage and each request's life,
and reports every place where the stream contradicts the contract.

`check_run` returns human-readable problems (empty = fine); `check_expect` reads a
scenario's `expect:` block; `check_result` cross-checks the `--json` result object
against the events.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas.admission.model import Config, Tenant
from jupyter_gpuaas.sim.scenario import Scenario, ScenarioRequest

Event = dict[str, Any]

EPS = 1e-9

#: States a request can be in during the replay. `preempted-job` (preempted, not yet
#: requeued) and `expired` (reservation ran out, not yet requeued) are transient.
TERMINAL = frozenset({"rejected", "finished", "cancelled", "preempted"})

#: Result-object states (SCENARIO.md) that each replay state may be reported as.
RESULT_STATES: Mapping[str, frozenset[str]] = {
    "queued": frozenset({"queued"}),
    "admitted": frozenset({"admitted"}),
    "parked": frozenset({"parked"}),
    "culled": frozenset({"culled"}),
    "expired": frozenset({"culled", "queued"}),
    "finished": frozenset({"finished"}),
    "cancelled": frozenset({"cancelled"}),
    "rejected": frozenset({"rejected"}),
    "preempted": frozenset({"preempted"}),
}


def events_of(decisions: Iterable[Any]) -> list[Event]:
    """Decision objects or already-decoded JSON lines, as plain event dicts."""
    out: list[Event] = []
    for d in decisions:
        out.append(dict(d) if isinstance(d, Mapping) else d.to_json())
    return out


# --------------------------------------------------------------------------- quota rules


def lendable(tenant: Tenant, flavor: str) -> int:
    """What a member lends to its cohort: lending_limit capped at nominal, else nominal."""
    nominal = tenant.quota.get(flavor, 0)
    limit = tenant.lending_limit.get(flavor)
    return nominal if limit is None else min(limit, nominal)


def guaranteed(tenant: Tenant, flavor: str) -> int:
    """The part of nominal that is never lent."""
    return tenant.quota.get(flavor, 0) - lendable(tenant, flavor)


def members(config: Config, cohort: str) -> list[Tenant]:
    return [t for t in config.tenants.values() if t.cohort == cohort]


def quota_problem(
    config: Config, usage: Mapping[tuple[str, str], int], tenant: str, flavor: str
) -> str | None:
    """Why `usage` breaks SCENARIO.md's quota rule for (tenant, flavor), or None."""
    spec = config.tenants[tenant]
    used = usage.get((tenant, flavor), 0)
    if flavor not in spec.quota:
        return f"{tenant}/{flavor} uses {used} of a flavor absent from its quota" if used else None
    nominal = spec.quota[flavor]
    if spec.cohort is None:
        if used > nominal:
            return f"{tenant}/{flavor} uses {used} > nominal {nominal} without cohort"
        return None
    limit = spec.borrowing_limit.get(flavor)
    if limit is not None and used > nominal + limit:
        return f"{tenant}/{flavor} uses {used} > nominal {nominal} + borrowing_limit {limit}"
    if spec.cohort in config.cohorts:
        return tree_problem(config, usage, spec.cohort, flavor)
    group = members(config, spec.cohort)
    drawn = sum(max(0, usage.get((m.name, flavor), 0) - guaranteed(m, flavor)) for m in group)
    pool = sum(lendable(m, flavor) for m in group)
    if drawn > pool:
        return f"cohort {spec.cohort}/{flavor} draws {drawn} > lendable {pool}"
    return None


def tree_problem(
    config: Config, usage: Mapping[tuple[str, str], int], cohort: str | None, flavor: str
) -> str | None:
    """SCENARIO.md's cohort trees, recomputed from scratch (Kueue's resource nodes): per
    node, subtree quota SQ (own quota plus what each child passes up, SQ - LQ), local quota
    LQ (SQ - lending limit, or 0 without one; a tenant's: nominal - lendable) and usage U
    (a cohort's: what each child uses beyond its LQ). The root stays within SQ; a node with
    a borrowing limit uses its parent for no more than SQ - LQ + limit."""
    if cohort is None:
        return None
    root = cohort
    while config.cohorts[root].parent is not None:
        root = config.cohorts[root].parent or root

    def node(c: str) -> tuple[int, int, int]:
        spec = config.cohorts[c]
        sq = spec.quota.get(flavor, 0)
        used = 0
        for t in config.tenants.values():
            if t.cohort == c:
                g = guaranteed(t, flavor)
                sq += lendable(t, flavor)
                used += max(0, usage.get((t.name, flavor), 0) - g)
        for k, kspec in config.cohorts.items():
            if kspec.parent == c:
                ksq, klq, ku = node(k)
                sq += ksq - klq
                used += max(0, ku - klq)
        lq = max(0, sq - spec.lending_limit[flavor]) if flavor in spec.lending_limit else 0
        limit = spec.borrowing_limit.get(flavor)
        if limit is not None and max(0, used - lq) > sq - lq + limit:
            problems.append(
                f"cohort {c}/{flavor} subtree uses {used} > quota {sq} + borrowing {limit}"
            )
        return sq, lq, used

    problems: list[str] = []
    sq, _, used = node(root)
    if used > sq:
        problems.append(f"cohort {root}/{flavor} subtree uses {used} > its quota {sq}")
    return problems[0] if problems else None


def tree_max_hold(config: Config, tenant: Tenant, flavor: str) -> float:
    """What a tenant in a tree could hold with everyone else idle (Kueue's potential
    available): walk up, keeping what each level keeps and what its parent lends, capped
    by each level's borrowing limit."""
    nominal = tenant.quota[flavor]
    lim = tenant.lending_limit.get(flavor)
    keep: float = 0 if lim is None else nominal - min(lim, nominal)
    path: list[str] = []
    c: str | None = tenant.cohort
    while c is not None:
        path.append(c)
        c = config.cohorts[c].parent

    def sq(c: str) -> int:
        # Subtree quota as Kueue counts it: what children pass up (their lendable part).
        tenants = [t for t in config.tenants.values() if t.cohort == c]
        kids = [n for n, s in config.cohorts.items() if s.parent == c]
        own = config.cohorts[c].quota.get(flavor, 0)
        return (
            own
            + sum(lendable(t, flavor) for t in tenants)
            + sum(
                sq(k)
                - (
                    max(0, sq(k) - config.cohorts[k].lending_limit[flavor])
                    if flavor in config.cohorts[k].lending_limit
                    else 0
                )
                for k in kids
            )
        )

    avail: float = sq(path[-1])
    for c in reversed(path[:-1]):
        spec = config.cohorts[c]
        s = sq(c)
        local = max(0, s - spec.lending_limit[flavor]) if flavor in spec.lending_limit else 0
        avail = local + avail
        if flavor in spec.borrowing_limit:
            avail = min(avail, s + spec.borrowing_limit[flavor])
    avail = keep + avail
    limit = tenant.borrowing_limit.get(flavor)
    return avail if limit is None else min(avail, nominal + limit)


def max_hold(config: Config, tenant: Tenant, flavor: str) -> float:
    """The most a tenant could ever hold of a flavor: nominal plus what it may borrow."""
    if flavor not in tenant.quota:
        return 0
    nominal = tenant.quota[flavor]
    if tenant.cohort is None:
        return nominal
    if tenant.cohort in config.cohorts:
        return tree_max_hold(config, tenant, flavor)
    others = sum(lendable(m, flavor) for m in members(config, tenant.cohort) if m is not tenant)
    limit = tenant.borrowing_limit.get(flavor)
    return nominal + min(others, math.inf if limit is None else limit)


def allowed_flavors(config: Config, req: ScenarioRequest) -> list[str]:
    """Flavors a request may run on: its pinned one if the tenant has quota for it, else
    the tenant's quota flavors (in preference order)."""
    tenant = config.tenants.get(req.tenant)
    if tenant is None:
        return []
    if req.flavor is not None:
        return [req.flavor] if req.flavor in tenant.quota and req.flavor in config.flavors else []
    return [f for f in tenant.quota if f in config.flavors]


def must_reject(config: Config, req: ScenarioRequest) -> bool:
    """SCENARIO.md's rejection rule: unknown tenant/flavor, or no allowed flavor whose
    nodes are wide enough and whose quota the tenant could ever reach."""
    if req.tenant not in config.tenants:
        return True
    if req.flavor is not None and req.flavor not in config.flavors:
        return True
    tenant = config.tenants[req.tenant]
    return not any(
        req.gpus <= config.flavors[f].gpus_per_node and req.gpus <= max_hold(config, tenant, f)
        for f in allowed_flavors(config, req)
    )


def _tenant_setting(config: Config, tenant: str, name: str) -> float:
    spec = config.tenants.get(tenant)
    value = getattr(spec, name, None) if spec is not None else None
    return float(getattr(config.policy, name) if value is None else value)


def _busy_at(req: ScenarioRequest, first_admit: float, t: float) -> bool:
    """Whether a request uses its GPUs at t, on the timeline of its first admission."""
    if req.busy is None:
        return True
    off = t - first_admit
    return any(s - EPS <= off < e - EPS for s, e in req.busy)


# --------------------------------------------------------------------------- the replay


@dataclass
class Life:
    """What the replay knows about one request."""

    spec: ScenarioRequest | None
    state: str = "unsubmitted"
    submits: int = 0
    last_event: str = ""
    last_t: float = -1.0
    admits: int = 0
    first_admit: float | None = None
    admit_t: float | None = None
    flavor: str | None = None  # flavor of its current or parked reservation
    node: str | None = None
    devices: tuple[int, ...] = ()
    parked_at: float | None = None
    preemptions: int = 0
    culls: int = 0
    warned_by: str | None = None  # preempt_warning: its preemptor, and when it must go
    evict_at: float | None = None
    warned_t: float | None = None


@dataclass
class Snapshot:
    """State just after all decisions at `t`."""

    t: float
    held: dict[str, int]
    nodes: dict[str, int]


@dataclass
class Replay:
    """Rebuilds the world from events and collects contradictions with the contract."""

    scenario: Scenario
    errors: list[str] = field(default_factory=list)
    timeline: list[Snapshot] = field(default_factory=list)

    def __post_init__(self) -> None:
        cfg = self.scenario.config
        self.cfg = cfg
        self.specs = {r.id: r for r in self.scenario.requests}
        self.nodes: dict[str, str] = {}
        self.empty_since: dict[str, float] = {}
        for name, fl in cfg.flavors.items():
            for i in range(fl.nodes):
                self.nodes[f"{name}-{i}"] = name
                self.empty_since[f"{name}-{i}"] = 0.0
        self.bound: dict[str, dict[int, str]] = defaultdict(dict)  # node -> device -> id
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.lives: dict[str, Life] = {rid: Life(spec) for rid, spec in self.specs.items()}
        self.scale_ups: list[tuple[float, str]] = []
        self.missed_cancel: set[str] = set()
        self.withdrawn_by: set[str] = set()  # preemptors that withdrew warnings this instant

    # ----------------------------------------------------------------- helpers

    def err(self, t: float, msg: str) -> None:
        if len(self.errors) < 50:
            self.errors.append(f"t={t:g}: {msg}")

    def free(self, node: str) -> int:
        return self.cfg.flavors[self.nodes[node]].gpus_per_node - len(self.bound[node])

    def bind(self, t: float, rid: str, ev: Event, flavor: str, gpus: int) -> None:
        node = ev.get("node")
        devices = ev.get("devices")
        life = self.lives[rid]
        if node not in self.nodes:
            self.err(t, f"{rid} bound to {node!r}, which is not a ready node")
            return
        if self.nodes[node] != flavor:
            self.err(t, f"{rid} of flavor {flavor} bound to {node} of flavor {self.nodes[node]}")
        if not isinstance(devices, list | tuple) or len(devices) != gpus:
            self.err(t, f"{rid} bound devices {devices!r} for {gpus} GPUs")
            devices = list(devices or [])
        if len(set(devices)) != len(devices):
            self.err(t, f"{rid} bound a device twice: {devices}")
        per = self.cfg.flavors[self.nodes[node]].gpus_per_node
        for d in devices:
            if not (isinstance(d, int) and 0 <= d < per):
                self.err(t, f"{rid} device {d!r} out of range on {node} ({per} devices)")
            holder = self.bound[node].get(d)
            if holder is not None and holder != rid:
                self.err(t, f"{rid} bound {node}:{d}, already bound to {holder}")
            self.bound[node][d] = rid
        life.node, life.devices = node, tuple(devices)

    def unbind(self, t: float, rid: str) -> None:
        life = self.lives[rid]
        if life.node is not None and life.node in self.bound:
            for d in life.devices:
                if self.bound[life.node].get(d) == rid:
                    del self.bound[life.node][d]
            if not self.bound[life.node]:
                self.empty_since[life.node] = t
        life.node, life.devices = None, ()

    def release_quota(self, rid: str) -> None:
        life = self.lives[rid]
        if life.flavor is not None and life.spec is not None:
            self.usage[(life.spec.tenant, life.flavor)] -= life.spec.gpus
        life.flavor = None
        life.parked_at = None

    def expect_state(self, t: float, rid: str, ev: str, allowed: Iterable[str]) -> bool:
        state = self.lives[rid].state
        if state not in allowed:
            self.err(t, f"{ev} of {rid} while {state}")
            return False
        return True

    # ----------------------------------------------------------------- one event

    def apply(self, ev: Event) -> None:
        """Apply one event, checking it against the request's state (one branch per kind)."""
        t = float(ev["t"])
        kind = ev.get("event")
        rid = ev.get("id")
        if kind in ("scale_up", "node_ready", "scale_down"):
            self.apply_node(t, kind, ev)
            return
        if rid not in self.lives:
            self.err(t, f"{kind} of unknown request {rid!r}")
            return
        life = self.lives[rid]
        spec = life.spec
        assert spec is not None
        if life.state in TERMINAL:
            self.err(t, f"{kind} of {rid} after it was {life.state}")
            return
        if kind != "submit" and life.state == "unsubmitted":
            self.err(t, f"{kind} of {rid} before its submit")
            return

        if kind == "submit":
            life.submits += 1
            if life.submits > 1:
                self.err(t, f"{rid} submitted twice")
            if abs(t - spec.submit) > EPS:
                self.err(t, f"{rid} submitted at {t:g}, its submit time is {spec.submit:g}")
            for key, want in (("tenant", spec.tenant), ("gpus", spec.gpus), ("kind", spec.kind)):
                if ev.get(key) != want:
                    self.err(t, f"submit of {rid}: {key} {ev.get(key)!r}, expected {want!r}")
            life.state = "queued"
        elif kind == "reject":
            if life.last_event != "submit" or abs(life.last_t - t) > EPS:
                self.err(t, f"{rid} rejected, but not right after its submit")
            if not must_reject(self.cfg, spec):
                self.err(t, f"{rid} rejected although it could fit some day ({ev.get('reason')!r})")
            if not str(ev.get("reason") or "").strip():
                self.err(t, f"{rid} rejected without a reason")
            life.state = "rejected"
        elif kind == "admit":
            if self.expect_state(t, rid, kind, ("queued",)):
                if (
                    life.submits == 1
                    and life.last_event == "submit"
                    and must_reject(self.cfg, spec)
                ):
                    self.err(t, f"{rid} admitted although it must be rejected")
                if spec.cancel is not None and t >= spec.cancel - EPS:
                    self.err(t, f"{rid} admitted at {t:g}, at or after its cancel {spec.cancel:g}")
                flavor = ev.get("flavor")
                if ev.get("tenant") != spec.tenant or ev.get("gpus") != spec.gpus:
                    self.err(t, f"admit of {rid}: tenant/gpus {ev.get('tenant')}/{ev.get('gpus')}")
                if spec.flavor is not None and flavor != spec.flavor:
                    self.err(t, f"{rid} pinned to {spec.flavor} admitted on {flavor}")
                if flavor not in allowed_flavors(self.cfg, spec):
                    self.err(t, f"{rid} admitted on {flavor}, not an allowed flavor")
                if spec.tenant in self.cfg.tenants and isinstance(flavor, str):
                    life.flavor = flavor
                    self.usage[(spec.tenant, flavor)] += spec.gpus
                    self.bind(t, rid, ev, flavor, spec.gpus)
                    problem = quota_problem(self.cfg, self.usage, spec.tenant, flavor)
                    if problem:
                        self.err(t, f"after admit of {rid}: {problem}")
                life.admits += 1
                life.admit_t = t
                if life.first_admit is None:
                    life.first_admit = t
                life.state = "admitted"
        elif kind == "preempt_warning":
            self.warning(t, rid, life, ev)
        elif kind == "preempt_withdrawn":
            if life.warned_by is None:
                self.err(t, f"warning of {rid} withdrawn, but it was not warned")
            elif ev.get("by") != life.warned_by:
                self.err(t, f"{rid} warned by {life.warned_by}, withdrawn by {ev.get('by')!r}")
            self.withdrawn_by.add(str(ev.get("by")))
            self.unwarn(rid)
        elif kind == "preempt":
            if self.expect_state(t, rid, kind, ("admitted", "parked")):
                by = ev.get("by")
                if by not in self.lives or by == rid:
                    self.err(t, f"{rid} preempted by {by!r}, not another request")
                at_once = life.warned_by is None
                self.check_eviction(t, rid, life, by)
                if at_once and isinstance(by, str) and by in self.lives:
                    self.check_no_second_set(t, by)
                self.unbind(t, rid)
                self.release_quota(rid)
                life.preemptions += 1
                life.state = "preempted-job" if spec.kind == "job" else "preempted"
        elif kind == "requeue":
            self.expect_state(t, rid, kind, ("preempted-job", "culled", "expired"))
            life.state = "queued"
        elif kind == "cull":
            if spec.kind == "job":
                self.err(t, f"job {rid} culled: jobs are never culled")
            if _tenant_setting(self.cfg, spec.tenant, "idle_timeout") <= 0:
                self.err(t, f"{rid} culled although idle_timeout is 0")
            if self.expect_state(t, rid, kind, ("admitted",)):
                if (
                    life.admits == 1
                    and life.first_admit is not None
                    and _busy_at(spec, life.first_admit, t)
                ):
                    self.err(t, f"{rid} culled while busy")
                self.unbind(t, rid)
                life.culls += 1
                ttl = _tenant_setting(self.cfg, spec.tenant, "reservation_ttl")
                parked = bool(ev.get("parked"))
                if parked != (ttl > 0):
                    self.err(t, f"cull of {rid}: parked={parked} with reservation_ttl {ttl:g}")
                if parked:
                    life.parked_at = t
                    life.state = "parked"
                else:
                    self.release_quota(rid)
                    life.state = "culled"
                    self.unwarn(rid)
        elif kind == "resume":
            if self.expect_state(t, rid, kind, ("parked",)) and life.flavor is not None:
                self.bind(t, rid, ev, life.flavor, spec.gpus)
                life.parked_at = None
                life.state = "admitted"
        elif kind == "expire":
            if self.expect_state(t, rid, kind, ("parked",)):
                ttl = _tenant_setting(self.cfg, spec.tenant, "reservation_ttl")
                if life.parked_at is not None and abs(t - (life.parked_at + ttl)) > EPS:
                    self.err(t, f"{rid} parked at {life.parked_at:g} expired after ttl {ttl:g}")
                self.release_quota(rid)
                life.state = "expired"
                self.unwarn(rid)
        elif kind == "finish":
            ok = life.state in ("admitted", "parked", "culled", "expired") or (
                life.state == "queued" and spec.kind != "job" and life.admits > 0
            )
            if not ok:
                self.err(t, f"finish of {rid} while {life.state}")
            if (
                spec.kind == "job"
                and life.admit_t is not None
                and abs(t - (life.admit_t + spec.duration)) > EPS
            ):
                self.err(
                    t,
                    f"job {rid} admitted at {life.admit_t:g} for {spec.duration:g}s "
                    f"finished at {t:g}",
                )
            self.unbind(t, rid)
            self.release_quota(rid)
            life.state = "finished"
            self.unwarn(rid)
        elif kind == "cancel":
            if spec.cancel is None or abs(t - spec.cancel) > EPS:
                self.err(t, f"{rid} cancelled at {t:g}, its cancel time is {spec.cancel}")
            self.unbind(t, rid)
            self.release_quota(rid)
            life.state = "cancelled"
            self.unwarn(rid)
        else:
            self.err(t, f"unknown event {kind!r}")
        life.last_event, life.last_t = str(kind), t

    # ----------------------------------------------------------------- preemption with grace

    def grace(self, tenant: str) -> float:
        return _tenant_setting(self.cfg, tenant, "preemption_grace")

    def warning(self, t: float, rid: str, life: Life, ev: Event) -> None:
        """A server/kernel victim is warned: it keeps its devices (still held) until `at`."""
        spec = life.spec
        assert spec is not None
        by = ev.get("by")
        self.expect_state(t, rid, "preempt_warning", ("admitted", "parked"))
        if spec.kind == "job":
            self.err(t, f"job {rid} warned: jobs are preempted at once")
        grace = self.grace(spec.tenant)
        if grace <= 0:
            self.err(t, f"{rid} warned although its tenant's preemption_grace is 0")
        at = ev.get("at")
        if not isinstance(at, int | float) or abs(float(at) - (t + grace)) > EPS:
            self.err(t, f"{rid} warned to go at {at!r}, expected t + grace = {t + grace:g}")
        if not isinstance(by, str) or by not in self.lives or by == rid:
            self.err(t, f"{rid} warned by {by!r}, not another request")
        elif self.lives[by].state != "queued":
            self.err(t, f"{rid} warned by {by}, which is {self.lives[by].state}, not queued")
        else:
            self.check_no_second_set(t, by)
        if life.warned_by is not None:
            self.err(t, f"{rid} warned twice (by {life.warned_by} and {by})")
        life.warned_by = by if isinstance(by, str) else None
        life.evict_at = float(at) if isinstance(at, int | float) else None
        life.warned_t = t

    def check_eviction(self, t: float, rid: str, life: Life, by: Any) -> None:
        """A server/kernel with a grace goes only after its warning, at its deadline."""
        spec = life.spec
        assert spec is not None
        if spec.kind != "job" and self.grace(spec.tenant) > 0:
            if life.warned_by is None:
                self.err(t, f"{rid} preempted without a preempt_warning (grace > 0)")
            else:
                if by != life.warned_by:
                    self.err(t, f"{rid} warned by {life.warned_by}, preempted by {by!r}")
                if life.evict_at is not None and abs(t - life.evict_at) > EPS:
                    self.err(t, f"{rid} evicted at {t:g}, its warning said {life.evict_at:g}")
        self.unwarn(rid)

    def check_no_second_set(self, t: float, by: str) -> None:
        """A preemptor whose victims are in their grace picks no other victims."""
        for vid, other in self.lives.items():
            if other.warned_by == by and other.warned_t is not None and other.warned_t < t - EPS:
                self.err(t, f"{by} picks more victims while {vid} is in its grace for it")
                return

    def unwarn(self, rid: str) -> None:
        life = self.lives[rid]
        life.warned_by = life.evict_at = life.warned_t = None

    def pool_of(self, tenant: str) -> str:
        """The quota pool a tenant shares: the root of its cohort tree, or itself alone."""
        spec = self.cfg.tenants.get(tenant)
        c = spec.cohort if spec is not None else None
        if c is None:
            return tenant
        while c in self.cfg.cohorts and self.cfg.cohorts[c].parent is not None:
            c = self.cfg.cohorts[c].parent or c
        return c

    def warned_pools(self) -> set[str]:
        """Cohort trees (by root) or lone tenants where a preemptor waits for warned
        victims: the room they free is kept for it in its whole tree."""
        out: set[str] = set()
        for life in self.lives.values():
            by = self.lives.get(life.warned_by) if life.warned_by else None
            if by is not None and by.spec is not None and by.spec.tenant in self.cfg.tenants:
                out.add(self.pool_of(by.spec.tenant))
        return out

    def apply_node(self, t: float, kind: str | None, ev: Event) -> None:
        flavor = ev.get("flavor")
        if flavor not in self.cfg.flavors:
            self.err(t, f"{kind} of unknown flavor {flavor!r}")
            return
        auto = self.cfg.policy.autoscale.get(flavor)
        if auto is None:
            self.err(t, f"{kind} for {flavor}, which has no autoscale policy")
            return
        if kind == "scale_up":
            self.scale_ups.append((t, flavor))
            return
        node = ev.get("node")
        if not isinstance(node, str) or not node.startswith(f"{flavor}-"):
            self.err(t, f"{kind} of node {node!r}: not named {flavor}-<n>")
            return
        count = sum(1 for f in self.nodes.values() if f == flavor)
        if kind == "node_ready":
            if node in self.nodes:
                self.err(t, f"node {node} ready twice")
            if count + 1 > auto.max_nodes:
                self.err(t, f"{flavor} grows to {count + 1} nodes > max_nodes {auto.max_nodes}")
            asked = t - auto.provision_delay
            if not any(abs(ts - asked) <= EPS and f == flavor for ts, f in self.scale_ups):
                self.err(t, f"{node} ready without a scale_up of {flavor} at {asked:g}")
            self.nodes[node] = flavor
            self.empty_since[node] = t
        else:
            if node not in self.nodes:
                self.err(t, f"scale_down of missing node {node}")
                return
            if self.bound[node]:
                self.err(t, f"{node} removed while devices are bound: {dict(self.bound[node])}")
            if count - 1 < self.cfg.flavors[flavor].nodes:
                self.err(t, f"{flavor} shrinks below its {self.cfg.flavors[flavor].nodes} nodes")
            idle = t - self.empty_since.get(node, t)
            if idle < auto.scale_down_after - EPS:
                self.err(t, f"{node} removed after {idle:g}s idle < {auto.scale_down_after:g}")
            del self.nodes[node]
            self.bound.pop(node, None)

    # ----------------------------------------------------------------- boundaries

    def boundary(self, t: float) -> None:
        """Checks that hold once every decision at `t` is made."""
        for (tenant, flavor), _ in list(self.usage.items()):
            if tenant in self.cfg.tenants:
                problem = quota_problem(self.cfg, self.usage, tenant, flavor)
                if problem:
                    self.err(t, problem)
        for node, devs in self.bound.items():
            if devs and node not in self.nodes:
                self.err(t, f"devices bound on missing node {node}")
        for rid, life in self.lives.items():
            if life.state == "preempted-job":
                self.err(t, f"preempted job {rid} not requeued at the same instant")
            cancel = life.spec.cancel if life.spec is not None else None
            if (
                cancel is not None
                and cancel <= t + EPS
                and life.state not in TERMINAL
                and life.state != "unsubmitted"
                and rid not in self.missed_cancel
            ):
                self.missed_cancel.add(rid)
                self.err(t, f"{rid} is {life.state} after its cancel time {cancel:g}")
        for rid, life in self.lives.items():
            if life.evict_at is not None and life.evict_at <= t + EPS:
                self.err(t, f"{rid} still runs after its eviction deadline {life.evict_at:g}")
                self.unwarn(rid)
        for by in self.withdrawn_by:
            if by in self.lives and self.lives[by].state == "queued":
                self.err(t, f"{by} withdrew its warnings but was neither admitted nor cancelled")
        self.withdrawn_by.clear()
        self.best_effort_fifo(t)
        held: dict[str, int] = defaultdict(int)
        for life in self.lives.values():
            if life.node is not None and life.spec is not None:
                held[life.spec.tenant] += life.spec.gpus
        counts: dict[str, int] = defaultdict(int)
        for flavor in self.nodes.values():
            counts[flavor] += 1
        self.timeline.append(Snapshot(t, dict(held), dict(counts)))

    def fits_now(self, spec: ScenarioRequest) -> str | None:
        """A flavor where `spec` fits quota and a node right now, or None."""
        for flavor in allowed_flavors(self.cfg, spec):
            trial = dict(self.usage)
            trial[(spec.tenant, flavor)] = trial.get((spec.tenant, flavor), 0) + spec.gpus
            if quota_problem(self.cfg, trial, spec.tenant, flavor):
                continue
            if any(f == flavor and self.free(n) >= spec.gpus for n, f in self.nodes.items()):
                return flavor
        return None

    def best_effort_fifo(self, t: float) -> None:
        """BestEffortFIFO: after all decisions at t, no queued request of such a tenant fits.

        A tenant with a parked request that may be busy again is skipped: that request is
        served ahead of its tenant's queue, and whether it then blocks the queue is not
        pinned by the contract.
        """
        blocked: set[str] = set()
        # While a preemptor waits for warned victims, the room they free is kept for it
        # (Kueue keeps a preempting workload's usage in the cycle): its cohort is skipped.
        reclaiming = self.warned_pools()
        for name in self.cfg.tenants:
            if self.pool_of(name) in reclaiming:
                blocked.add(name)
        for life in self.lives.values():
            if life.state == "parked" and life.spec is not None:
                first = life.first_admit
                if life.admits > 1 or first is None or _busy_at(life.spec, first, t):
                    blocked.add(life.spec.tenant)
        for rid, life in self.lives.items():
            spec = life.spec
            if life.state != "queued" or spec is None or spec.tenant in blocked:
                continue
            tenant = self.cfg.tenants.get(spec.tenant)
            if tenant is None or tenant.queueing != "BestEffortFIFO":
                continue
            flavor = self.fits_now(spec)
            if flavor is not None:
                self.err(t, f"BestEffortFIFO: queued {rid} ({spec.gpus} GPUs) fits on {flavor}")

    def finish(self, end_t: float | None) -> None:
        until = self.scenario.until
        for rid, life in self.lives.items():
            spec = life.spec
            assert spec is not None
            if life.submits == 0 and (until is None or spec.submit < until - EPS):
                self.err(spec.submit, f"{rid} never submitted")
            if life.state in ("preempted-job",):
                self.err(end_t or 0.0, f"{rid} ends preempted without requeue")


def replay(scenario: Scenario, decisions: Sequence[Any]) -> Replay:
    """Replay events, checking after every event and at every timestamp boundary."""
    rp = Replay(scenario)
    last: float | None = None
    for ev in events_of(decisions):
        t = float(ev["t"])
        if last is not None and t < last - EPS:
            rp.err(t, f"event out of time order (after t={last:g}): {ev}")
        if last is not None and t > last + EPS:
            rp.boundary(last)
        last = t if last is None else max(last, t)
        rp.apply(ev)
    if last is not None:
        rp.boundary(last)
    rp.finish(last)
    return rp


def check_run(scenario: Scenario, decisions: Sequence[Any]) -> list[str]:
    """Every invariant of SCENARIO.md over one run; an empty list means the run is sound."""
    return replay(scenario, decisions).errors


# --------------------------------------------------------------------------- expect:


def at(timeline: Sequence[Snapshot], t: float) -> Snapshot | None:
    """The state just after all decisions at time t (the last snapshot at or before t)."""
    snap = None
    for s in timeline:
        if s.t <= t + EPS:
            snap = s
        else:
            break
    return snap


def _first(events: Sequence[Event], kind: str, rid: str) -> Event | None:
    return next((e for e in events if e.get("event") == kind and e.get("id") == rid), None)


def check_expect(
    scenario: Scenario, result: Mapping[str, Any], decisions: Sequence[Any]
) -> list[str]:
    """Every key of a scenario's `expect:` block, against the result and the events."""
    exp = scenario.expect or {}
    events = events_of(decisions)
    rp = replay(scenario, events)
    reqs: Mapping[str, Any] = result.get("requests", {})
    errs: list[str] = []
    ids_by_event: dict[str, set[str]] = defaultdict(set)
    for e in events:
        if "id" in e:
            ids_by_event[str(e["event"])].add(str(e["id"]))

    def first_admit(rid: str) -> float | None:
        ev = _first(events, "admit", rid)
        return None if ev is None else float(ev["t"])

    for rid in exp.get("admitted") or []:
        if rid not in ids_by_event["admit"]:
            errs.append(f"{rid} never admitted, expected admitted")
    for rid in exp.get("never_admitted") or []:
        if rid in ids_by_event["admit"]:
            errs.append(f"{rid} admitted at {first_admit(rid)}, expected never")
        state = (reqs.get(rid) or {}).get("state")
        if state != "queued":
            errs.append(f"{rid} ends {state}, expected still queued")
    for rid in exp.get("rejected") or []:
        if rid not in ids_by_event["reject"]:
            errs.append(f"{rid} not rejected")
        if (reqs.get(rid) or {}).get("state") != "rejected":
            errs.append(f"{rid} state {(reqs.get(rid) or {}).get('state')}, expected rejected")
    for key, kind in (("preempted", "preempt"), ("culled", "cull")):
        for rid in exp.get(key) or []:
            if rid not in ids_by_event[kind]:
                errs.append(f"{rid} not {key}")
    for rid in exp.get("not_preempted") or []:
        if rid in ids_by_event["preempt"]:
            errs.append(f"{rid} preempted, expected not")
    for rid, when in (exp.get("admitted_at") or {}).items():
        got = first_admit(rid)
        if got is None or abs(got - float(when)) > 1e-6:
            errs.append(f"{rid} first admitted at {got}, expected {when}")
        res = (reqs.get(rid) or {}).get("admitted_at")
        if got is not None and (res is None or abs(float(res) - got) > 1e-6):
            errs.append(f"result says {rid} admitted_at {res}, events say {got}")
    for rid, when in (exp.get("resumed_at") or {}).items():
        ev = _first(events, "resume", rid)
        got = None if ev is None else float(ev["t"])
        if got is None or abs(got - float(when)) > 1e-6:
            errs.append(f"{rid} first resumed at {got}, expected {when}")
    for rid, flavor in (exp.get("flavor_of") or {}).items():
        ev = _first(events, "admit", rid)
        if ev is None or ev.get("flavor") != flavor:
            errs.append(
                f"{rid} admitted on {None if ev is None else ev.get('flavor')}, expected {flavor}"
            )
    for a, b in exp.get("order") or []:
        ta, tb = first_admit(a), first_admit(b)
        if ta is None or (tb is not None and ta > tb + EPS):
            errs.append(f"order: {a} (admitted {ta}) should be admitted no later than {b} ({tb})")
    for t, want in (exp.get("held_at") or {}).items():
        snap = at(rp.timeline, float(t))
        held = snap.held if snap else {}
        for tenant, gpus in want.items():
            if held.get(tenant, 0) != gpus:
                errs.append(f"held_at {t}: {tenant} holds {held.get(tenant, 0)}, expected {gpus}")
    for t, want in (exp.get("nodes_at") or {}).items():
        snap = at(rp.timeline, float(t))
        counts = snap.nodes if snap else {f: fl.nodes for f, fl in scenario.config.flavors.items()}
        for flavor, n in want.items():
            if counts.get(flavor, 0) != n:
                errs.append(f"nodes_at {t}: {flavor} has {counts.get(flavor, 0)}, expected {n}")
    return errs


def check_result(
    scenario: Scenario, result: Mapping[str, Any], decisions: Sequence[Any]
) -> list[str]:
    """The `--json` result agrees with the events: states, first admission, counters."""
    rp = replay(scenario, decisions)
    reqs: Mapping[str, Any] = result.get("requests", {})
    errs: list[str] = []
    for rid, life in rp.lives.items():
        entry = reqs.get(rid)
        if life.state == "unsubmitted":
            if entry is not None and entry.get("state") not in ("queued", None):
                errs.append(f"{rid} never submitted but reported {entry.get('state')}")
            continue
        if entry is None:
            errs.append(f"{rid} missing from the result")
            continue
        legal = RESULT_STATES.get(life.state, frozenset())
        if entry.get("state") not in legal:
            errs.append(f"{rid} reported {entry.get('state')!r}, events end it {life.state}")
        got = entry.get("admitted_at")
        if (got is None) != (life.first_admit is None) or (
            got is not None
            and life.first_admit is not None
            and abs(float(got) - life.first_admit) > 1e-6
        ):
            errs.append(f"{rid} admitted_at {got}, events say {life.first_admit}")
        for key, n in (("preemptions", life.preemptions), ("culls", life.culls)):
            if key in entry and entry[key] != n:
                errs.append(f"{rid} {key} {entry[key]}, events say {n}")
    return errs
