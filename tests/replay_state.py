"""The world a replay rebuilds from a run's events, and its preemption-with-grace rules.

`ReplayState` holds what the replay knows (ready nodes, bound devices, quota usage, each
request's `Life`) and the bookkeeping every check uses (binding devices, releasing quota);
`Grace` adds what preempt_warning and its withdrawal must respect. Both are bases of
replay_checks.py's `Replay`, which walks the events.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scenario_rules import EPS, tenant_setting

from jupyter_gpuaas.sim.scenario import Scenario, ScenarioRequest

Event = dict[str, Any]

#: States a request can be in during the replay. `preempted-job` (preempted, not yet
#: requeued) and `expired` (reservation ran out, not yet requeued) are transient.
TERMINAL = frozenset({"rejected", "finished", "cancelled", "preempted"})


def events_of(decisions: Iterable[Any]) -> list[Event]:
    """Decision objects or already-decoded JSON lines, as plain event dicts."""
    out: list[Event] = []
    for d in decisions:
        out.append(dict(d) if isinstance(d, Mapping) else d.to_json())
    return out


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
class ReplayState:
    """What the replay rebuilds from events, and its bookkeeping."""

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


class Grace(ReplayState):
    """Preemption with grace: a warned victim keeps its devices until its deadline, and
    the room it frees is kept for its preemptor's whole quota pool."""

    def grace(self, tenant: str) -> float:
        return tenant_setting(self.cfg, tenant, "preemption_grace")

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
