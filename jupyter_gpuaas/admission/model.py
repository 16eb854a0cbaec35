"""The words of the admission core as plain data: flavors, tenants, policy, requests, decisions.

Nothing here does I/O or reads a clock; times are seconds on whatever clock the driver
uses (virtual in the simulator, the epoch in the gateway).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

KINDS: Final = ("server", "kernel", "job")
QUEUEING = ("BestEffortFIFO", "StrictFIFO")
WITHIN_TENANT = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
RECLAIM_WITHIN_COHORT = ("Never", "LowerPriority", "Any")
BORROW_WITHIN_COHORT = ("Never", "LowerPriority")


class State(str, Enum):
    """Where a request stands. The values are the states of SCENARIO.md."""

    QUEUED = "queued"
    ADMITTED = "admitted"
    PARKED = "parked"
    CULLED = "culled"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    PREEMPTED = "preempted"


#: States after which a request holds nothing and will never run again.
TERMINAL: Final = frozenset({State.FINISHED, State.CANCELLED, State.REJECTED, State.PREEMPTED})


@dataclass(frozen=True)
class Flavor:
    """A kind of GPU: a pool of identical nodes with `gpus_per_node` devices each."""

    name: str
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Preemption:
    within_tenant: str = "Never"
    reclaim_within_cohort: str = "Never"
    borrow_within_cohort: str = "Never"


@dataclass(frozen=True)
class Tenant:
    """A team that owns GPU quota (a JupyterHub group; Kueue's ClusterQueue).

    `quota` keeps its key order: it is the order in which flavors are tried.
    `idle_timeout`/`reservation_ttl` of None fall back to the global policy.
    """

    name: str
    quota: Mapping[str, int]
    cohort: str | None = None
    borrowing_limit: Mapping[str, int] = field(default_factory=dict)
    lending_limit: Mapping[str, int] = field(default_factory=dict)
    weight: float = 1.0
    queueing: str = "BestEffortFIFO"
    preemption: Preemption = field(default_factory=Preemption)
    idle_timeout: float | None = None
    reservation_ttl: float | None = None
    # Seconds a `server`/`kernel` of THIS tenant keeps running once chosen as a preemption
    # victim (the victim's tenant decides: it is its users who are interrupted).
    preemption_grace: float | None = None

    def lendable(self, flavor: str) -> int:
        nominal = self.quota.get(flavor, 0)
        limit = self.lending_limit.get(flavor)
        return nominal if limit is None else min(limit, nominal)

    def guaranteed(self, flavor: str) -> int:
        """The part of nominal quota that is never lent: (nominal - lendable)."""
        return self.quota.get(flavor, 0) - self.lendable(flavor)


@dataclass(frozen=True)
class Cohort:
    """A node of a cohort tree (Kueue's hierarchical Cohort): it pools its own `quota` and
    its children's into its subtree. Limits cap what the subtree lends to and borrows from
    its parent, so only a cohort with a parent has them."""

    name: str
    parent: str | None = None
    quota: Mapping[str, int] = field(default_factory=dict)
    borrowing_limit: Mapping[str, int] = field(default_factory=dict)
    lending_limit: Mapping[str, int] = field(default_factory=dict)
    weight: float = 1.0


@dataclass(frozen=True)
class Autoscale:
    """Scale-up and scale-down of one flavor's node pool."""

    max_nodes: int
    provision_delay: float = 0.0
    scale_down_after: float = 600.0
    # True: the core models provisioning itself (node_ready after provision_delay), as the
    # simulator and the gateway's simulated scaler do. False: the core only reports demand
    # and the driver adds nodes when they really join.
    provision: bool = True


@dataclass(frozen=True)
class Policy:
    fair_sharing: bool = False
    idle_timeout: float = 0.0
    reservation_ttl: float = 0.0
    autoscale: Mapping[str, Autoscale] = field(default_factory=dict)
    # Seconds before a cull that a `cull_warning` decision is made (0 = no warning).
    cull_warning: float = 0.0
    # Seconds an admitted holder may go without a heartbeat (0 = no leases, as in the
    # simulator where holders cannot crash).
    lease_ttl: float = 0.0
    # Seconds a `server`/`kernel` victim keeps its devices after `preempt_warning`
    # (0 = preempted at once, as jobs always are).
    preemption_grace: float = 0.0
    # A submission of the same user, tenant, kind and size as a parked reservation takes
    # that reservation over (the gateway: a user coming back within the reservation TTL).
    # Off in the simulator, whose scenarios replay every request as its own.
    take_over_parked: bool = False
    # At most one admission per tenant in an admission cycle, as Kueue's scheduler takes one
    # head per ClusterQueue a cycle (heads.py): a burst is shared out in turns, whatever the
    # order or the weights say. Off: one order over every request (SCENARIO.md "Order").
    one_head_per_cycle: bool = False


@dataclass(frozen=True)
class Config:
    """Flavors, tenants and policy: the quota part of a scenario, shared with the gateway."""

    flavors: Mapping[str, Flavor]
    tenants: Mapping[str, Tenant]
    policy: Policy = field(default_factory=Policy)
    # The declared cohort tree; a tenant's cohort not named here is a flat root cohort.
    cohorts: Mapping[str, Cohort] = field(default_factory=dict)


# `init=False` and a written `__init__` on the two classes made by the hundred thousand:
# compiled with mypyc, a dataclass's generated `__init__` stays interpreted Python (4x
# slower to build one), a written one is compiled. `@dataclass` still gives eq and repr.
@dataclass(init=False)
class Request:
    """A demand for `gpus` GPUs by `user` on behalf of `tenant` (Kueue's Workload).

    The driver creates it; the core owns the fields below the line once submitted.
    """

    id: str
    tenant: str
    user: str
    kind: str
    gpus: int
    submit_time: float
    flavor: str | None
    priority: int
    busy: bool
    # --- owned by the core ---
    state: State
    queue_time: float  # ordering time: the submit time, or the time of a re-queue
    seq: int  # arrival order, the last tie-breaker
    assigned_flavor: str | None  # flavor of the current or parked reservation
    node: str | None
    devices: tuple[int, ...]
    first_admit: float | None
    admit_time: float | None
    idle_since: float | None
    park_expires: float | None
    lease_expires: float | None
    wants_devices: bool  # parked and busy again: waits to be resumed
    preemptions: int
    culls: int  # culls in its current hold (`held_since`)
    reason: str
    resumed_from: str | None  # the parked reservation this request took over
    preempt_at: float | None  # warned victim: evicted then, unless withdrawn
    preempted_by: str | None  # ... to make room for this request
    # When its current hold of quota began: its latest admission. A resume from its
    # parked reservation goes on with the same hold, and so does a new request of its
    # user that takes the reservation over (`resumed_from`): the wait estimates' age of
    # a grant and their history's samples are holds (admission/estimate.py `History`).
    held_since: float | None

    def __init__(
        self,
        id: str,
        tenant: str,
        user: str,
        kind: str,
        gpus: int,
        submit_time: float,
        flavor: str | None = None,
        priority: int = 0,
        busy: bool = True,
        state: State = State.QUEUED,
        queue_time: float = 0.0,
        seq: int = 0,
        assigned_flavor: str | None = None,
        node: str | None = None,
        devices: tuple[int, ...] = (),
        first_admit: float | None = None,
        admit_time: float | None = None,
        idle_since: float | None = None,
        park_expires: float | None = None,
        lease_expires: float | None = None,
        wants_devices: bool = False,
        preemptions: int = 0,
        culls: int = 0,
        reason: str = "",
        resumed_from: str | None = None,
        preempt_at: float | None = None,
        preempted_by: str | None = None,
        held_since: float | None = None,
    ) -> None:
        self.id = id
        self.tenant = tenant
        self.user = user
        self.kind = kind
        self.gpus = gpus
        self.submit_time = submit_time
        self.flavor = flavor
        self.priority = priority
        self.busy = busy
        self.state = state
        self.queue_time = queue_time
        self.seq = seq
        self.assigned_flavor = assigned_flavor
        self.node = node
        self.devices = devices
        self.first_admit = first_admit
        self.admit_time = admit_time
        self.idle_since = idle_since
        self.park_expires = park_expires
        self.lease_expires = lease_expires
        self.wants_devices = wants_devices
        self.preemptions = preemptions
        self.culls = culls
        self.reason = reason
        self.resumed_from = resumed_from
        self.preempt_at = preempt_at
        self.preempted_by = preempted_by
        self.held_since = held_since

    @property
    def holds_quota(self) -> bool:
        return self.state in (State.ADMITTED, State.PARKED)

    @property
    def holds_devices(self) -> bool:
        return self.state is State.ADMITTED


@dataclass(frozen=True, init=False)
class Decision:
    """One thing the core decided at time `t`: an event of SCENARIO.md's table.

    `fields` carries the event's own fields (tenant, flavor, node, devices, by, reason, ...).
    """

    t: float
    event: str
    id: str | None
    fields: Mapping[str, Any]

    def __init__(
        self, t: float, event: str, id: str | None = None, fields: Mapping[str, Any] | None = None
    ) -> None:
        # Frozen: set through object's own setattr (mypyc compiles it to a plain store).
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "event", event)
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "fields", {} if fields is None else fields)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "event": self.event}
        if self.id is not None:
            out["id"] = self.id
        out.update(self.fields)
        return out
