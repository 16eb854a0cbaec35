"""The core's driver: the wall clock, persistence, announcements and the loops.

Every change goes the same way: call the admission core (it decides), write the decisions
and the request rows they changed in one transaction, commit, and only then tell anyone
(the HTTP answer, SSE listeners, metrics, the scaler). The core is rebuilt from the store
on start (`restore`), so a crash at any instant leaves a state the core was really in.

`Arbiter` holds memory (the core, the live requests and what the API keeps beside them)
and its collaborators as fields, as Kueue's scheduler holds its queues and cache:
`group` (group_commit.py: operations run in groups, each committed in one transaction
before it is announced, and what happens when the store refuses), `calls`
(store_calls.py: store work in threads with deadlines, the store's health) and `stalls`
(stalls.py: the gap every lease is extended by). Views are functions of the core's state
(views.py: `request_json`, `devices_json`, `tenants_json`, the metric snapshot) that the
arbiter calls. This module: configuration, start and stop, the admission and sampling
loops, operations, staging their decisions (`commit`) and announcing them, and rebuilding
memory from the store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from jupyter_gpuaas.admission.config import SpecError, default_cull_warning, parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.estimate import FORECAST, History, session_start
from jupyter_gpuaas.admission.model import (
    TERMINAL,
    Autoscale,
    Config,
    Decision,
    Flavor,
    Request,
    State,
)
from jupyter_gpuaas.admission.schema import QUOTAS_SCHEMA
from jupyter_gpuaas.sim.schema_check import check_schema
from jupyter_gpuaas.words import culled_reason, ended_by, expired_reason, preempted_reason

from ..devices import DeviceSample, Inventory, NodeInfo
from . import views
from .engine import Engine
from .estimates import Estimates
from .events import Event, EventBus
from .group_commit import Conflict, Duplicate, GroupCommit, Staged
from .kueue_engine import KueueEngine
from .leader import NotLeader
from .metrics import GatewayMetrics
from .rows import NodeRow, RequestRow
from .scalers import Scaler
from .stalls import Stalls
from .store import (
    Batch,
    Store,
    StoreUnavailable,
    check_snapshot,
    describe,
    row_to_request,
    snapshot,
)
from .store_calls import StoreCalls
from .validate import NAME_RULE, is_name
from .views import CoreState, idle_timeout, meta_of

# The reason the core gives a grant it ends because its lease ran out (core.py `advance`).
LEASE_EXPIRED = "lease expired"

log = logging.getLogger("jupyter_gpuaas.gateway")

T = TypeVar("T")


def new_request_id() -> str:
    return "r-" + uuid.uuid4().hex[:16]


@dataclasses.dataclass
class Stored:
    """What a restore reads from the store (read in a store thread, used on the loop)."""

    overrides: dict[str, Any]
    nodes: list[NodeRow]
    live: list[RequestRow]
    hold_times: list[tuple[str, float]]
    # (kind, user, seconds) of ended grants, oldest first: the estimates' history.
    holds: list[tuple[str, str, float, int, bool, float]] = dataclasses.field(default_factory=list)
    # What entered the queue in the last forecast period (submissions, culled users
    # back), oldest first.
    recent: list[Request] = dataclasses.field(default_factory=list)


class Arbiter:
    """Owns the core, the store and the announcements of one gateway."""

    def __init__(
        self,
        *,
        quotas: Mapping[str, Any],
        store: Store,
        inventory: Inventory,
        metrics: GatewayMetrics,
        scaler: Scaler,
        bus: EventBus | None = None,
        lease_ttl: float = 120.0,
        tick: float = 1.0,
        sample_interval: float = 5.0,
        lock_timeout: float = 2.0,
        retention: float = 0.0,
        store_timeout: float = 5.0,
        kueue: KueueEngine | None = None,
    ) -> None:
        self.quotas = dict(quotas)
        # Who decides (engine.py): the core, unless Kueue does (`--admission kueue`).
        self.kueue = kueue
        self.store = store
        self.inventory = inventory
        self.metrics = metrics
        self.scaler = scaler
        self.bus = bus or EventBus()
        self.lease_ttl = lease_ttl
        self.tick = tick
        self.sample_interval = sample_interval
        self.lock_timeout = lock_timeout
        self.retention = retention
        # Store work runs in threads, awaited at most `store_timeout` seconds
        # (store_calls.py); the time the store or the loop could not act is owed to the
        # leases (stalls.py); operations run in groups, each committed before it is
        # announced (group_commit.py).
        self.store_timeout = store_timeout
        self.stalls = Stalls()
        self.calls = StoreCalls(store, timeout=store_timeout, on_recovered=self.stalls.add)
        self.group = GroupCommit(store, self.calls, self, lock_timeout=lock_timeout)
        # Why memory was dropped (the store could not be read back), or None.
        self.broken: str | None = None
        # Two gateways, one leader (leader.py): a standby mirrors the store and decides
        # nothing; `leader_url` is who leads, when known. One gateway: always the leader.
        self.leader = True
        self.leader_url: str | None = None
        # A standby: the leader's lease is not being renewed (leader.py); changes are
        # refused with 503 rather than sent to a leader that may be frozen.
        self.leader_stale = False
        self._last_rebuild = 0.0
        self._next_prune = 0.0
        # Requests handed to the core, by id, while live (the core mutates them).
        self.requests: dict[str, Request] = {}
        # (user, Idempotency-Key) of live requests, and of those being submitted.
        self.keys: dict[tuple[str, str], str] = {}
        # What the API adds to a request: name, created, updated, utilization.
        self.meta: dict[str, dict[str, Any]] = {}
        self.samples: list[DeviceSample] = []
        self.hold_times: dict[str, list[float]] = {}
        # Past hold times by kind and user, and the forward-run estimates of the queue as
        # it stands (estimates.py), dropped at each committed decision.
        self.history = History()
        # When each parked reservation was culled: how long after it its user came back
        # goes into the history (`History.came_back`).
        self._culled_at: dict[str, float] = {}
        self.estimates = Estimates()
        self._last_desired: dict[str, int] = {}
        self._last_ready: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # `request_json` of live requests as of the last staged batch (`_json_of`).
        self._json_cache: dict[str, dict[str, Any]] = {}
        check_names(parse_config(self.quotas))  # SpecError: the file breaks the name rule
        check_schema(self.quotas, QUOTAS_SCHEMA)  # the published schema holds too
        self.overrides = store.tenant_overrides()
        for name in self.overrides:
            if not is_name(name):
                log.warning("stored tenant %r breaks the name rule (%s)", name, NAME_RULE)
        self.config = self.make_config(self.quotas, self.overrides)
        self.core = AdmissionCore(self.config)

    # --- configuration ----------------------------------------------------------------

    def make_config(
        self, quotas: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
    ) -> Config:
        """Parse the quota file (plus admin overrides) into the core's Config.

        The file's `flavors` name the kinds of GPU; how many nodes each has comes from the
        inventory, and `gpus_per_node` (the width of autoscaled nodes) too when it has one.
        """
        data = dict(quotas)
        if overrides:
            tenants = dict(data.get("tenants") or {})
            tenants.update(overrides)
            data["tenants"] = tenants
        config = parse_config(data)
        per_node: dict[str, int] = {}
        for node in self.inventory.nodes():
            per_node[node.flavor] = max(per_node.get(node.flavor, 0), node.gpus)
        # nodes=0: the core would otherwise invent `<flavor>-<n>` nodes; the gateway adds
        # the inventory's real nodes with add_node (and only autoscaled ones scale down).
        flavors = {
            name: Flavor(name, 0, per_node.get(name, f.gpus_per_node))
            for name, f in config.flavors.items()
        }
        provision = self.scaler.manages_provisioning
        autoscale = {
            name: dataclasses.replace(a, provision=provision)
            for name, a in config.policy.autoscale.items()
        }
        # A user coming back within the reservation TTL takes over their parked quota.
        policy = dataclasses.replace(
            config.policy, lease_ttl=self.lease_ttl, autoscale=autoscale, take_over_parked=True
        )
        if "cull_warning" not in (data.get("policy") or {}):
            # Warnings on by default here (not in the simulator: see DEFAULT_CULL_WARNING).
            policy = dataclasses.replace(policy, cull_warning=default_cull_warning(config))
        return dataclasses.replace(config, flavors=flavors, policy=policy)  # keeps cohorts

    @property
    def engine(self) -> Engine:
        """Whom requests are handed to and whose queue the views read (engine.py)."""
        return self.core if self.kueue is None else self.kueue

    def autoscale(self, flavor: str) -> Autoscale | None:
        return self.config.policy.autoscale.get(flavor)

    # --- start and stop -----------------------------------------------------------------

    def restore(self, now: float, *, lock_wait: float | None = None) -> None:
        """Rebuild the core from the inventory and the store, then run one step.

        Its decisions are committed waiting up to `lock_wait` seconds for a lock held
        elsewhere (`lock_timeout` at start; a rebuild on the event loop does not wait)."""
        stored = self.read_stored()
        wait = self.lock_timeout if lock_wait is None else lock_wait
        staged = self._restored(now, stored)
        if staged:
            for st in staged:
                check_snapshot(st.snap)
            self.store.write_many([st.snap for st in staged], wait=wait)
            for st in staged:
                self._announce(st)
            self._maybe_scale()

    def read_stored(self) -> Stored:
        """Everything a restore needs from the store (blocking: a store thread's work)."""
        manages = self.scaler.manages_provisioning
        return Stored(
            overrides=self.store.tenant_overrides(),
            nodes=self.store.nodes() if manages else [],
            live=self.store.live_requests(),
            hold_times=list(self.store.ended_hold_times()),
            holds=self.store.ended_holds(),
            recent=self.store.arrivals_since(time.time() - FORECAST[0]),
        )

    def _restored(self, now: float, stored: Stored) -> list[Staged]:
        """Memory rebuilt from `stored` (on the loop); what it decided, staged."""
        self.overrides = stored.overrides
        self.config = self.make_config(self.quotas, self.overrides)
        self.core = AdmissionCore(self.config)
        staged = self._stage(lambda: self._restore_into(now, stored))
        log.info(
            "restored %d live requests on %d nodes", len(self.requests), len(self.core.nodes())
        )
        return staged

    def _restore_into(self, now: float, stored: Stored) -> None:
        decisions = self._load(now, stored)
        # The fresh leases are written too, like every decision: a restart right after
        # this one must not find the old ones.
        leased = [r for r in self.requests.values() if r.state is State.ADMITTED]
        self.commit(decisions + self.engine.step(now), now, extra=leased)

    def _load(self, now: float, stored: Stored) -> list[Decision]:
        """Load nodes and live requests into the core; the decisions it made doing so."""
        decisions: list[Decision] = []
        known = set(self.config.flavors)
        # Nodes the simulated scaler added are in the store (and, when this is a rebuild
        # rather than a start, in the inventory too): they stay autoscaled.
        stored_nodes = stored.nodes
        autoscaled = {n.name for n in stored_nodes}
        for node in self.inventory.nodes():
            if node.flavor not in known:
                log.warning("node %s has flavor %s, which no quota names", node.name, node.flavor)
                continue
            decisions += self.core.add_node(
                node.flavor, node.name, node.gpus, now, autoscaled=node.name in autoscaled
            )
        if self.scaler.manages_provisioning:
            present = {n.name for n in self.inventory.nodes()}
            for node_row in stored_nodes:
                if node_row.name in present or node_row.flavor not in known:
                    continue
                self.inventory.add_node(node_row.flavor, node_row.gpus, name=node_row.name)
                decisions += self.core.add_node(
                    node_row.flavor, node_row.name, node_row.gpus, now, autoscaled=True
                )
        for row in stored.live:
            req = row_to_request(row)
            self.meta[req.id] = meta_of(row)
            if row.idempotency_key is not None:
                self.keys[(row.user, row.idempotency_key)] = req.id
            if req.state is State.ADMITTED and self.lease_ttl > 0:
                # Holders could not heartbeat while the gateway was down: a fresh lease.
                req.lease_expires = max(req.lease_expires or 0.0, now + self.lease_ttl)
            self.requests[req.id] = req
            # A grant whose node or devices are gone comes back as a `finish` decision.
            decisions += self.engine.restore(req, now)
        for flavor, seconds in stored.hold_times:
            self.hold_times.setdefault(flavor, []).append(seconds)
        for kind, user, seconds, culls, gave_up, ended in stored.holds:
            self.history.add(kind, user, seconds, culls, gave_up, ended)
        self.estimates.arrived[:] = stored.recent
        return decisions

    # --- leadership (leader.py) -----------------------------------------------------------

    def follow(self, leader_url: str | None) -> None:
        """Be a standby: decide nothing, refuse changes, mirror the store for reads."""
        self.leader, self.leader_url = False, leader_url
        self.group.fail_queued(NotLeader(leader_url))

    def mirror_now(self) -> None:
        """`refresh_mirror`, blocking (at start-up, before the loop serves)."""
        self._mirror(self.read_stored)

    async def refresh_mirror(self) -> None:
        """A standby's view: the store as it is now, loaded as `restore` loads it, but
        nothing is committed or announced (its own decisions, if any, are the leader's
        to make). The store is read in a store thread, with its deadline."""
        if self.leader:
            return
        try:
            stored = await self.in_store(self.read_stored)
        except Exception as e:
            self._reset_memory()
            self.broken = f"the standby cannot read the store: {describe(e)}"
            return
        self._mirror(lambda: stored)

    def _mirror(self, read: Callable[[], Stored]) -> None:
        if self.leader:
            return
        self._reset_memory()
        try:
            stored = read()
            self.overrides = stored.overrides
            self.config = self.make_config(self.quotas, self.overrides)
            self.core = AdmissionCore(self.config)
            self._load(time.time(), stored)
            self.broken = None
        except Exception as e:
            self._reset_memory()
            self.broken = f"the standby cannot read the store: {describe(e)}"

    async def take_over(self) -> None:
        """Leadership won: restore from the store exactly as at start-up, then decide."""
        self.leader, self.leader_url = True, None
        await self.rebuild("this gateway took over as the leader")
        self.wake()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.stalls.start()
        self._tasks = [
            loop.create_task(self._admission_loop()),
            loop.create_task(self._sampling_loop()),
        ]
        follow = getattr(self.inventory, "follow", None)
        if follow is not None:  # an inventory that sees nodes join and leave (cluster.py)
            self._tasks.append(loop.create_task(follow(self.node_joined, self.node_left)))
        if self.kueue is not None:  # Kueue's Workloads, followed (kueue_engine.py)
            self._tasks += self.kueue.start(self)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:  # bounded: a task that swallowed its cancellation is left behind
            await asyncio.wait(self._tasks, timeout=self.store_timeout + 1)
        self.stalls.stop()
        # The last group: committed, or answered 503.
        await self.group.close(StoreUnavailable("the gateway is stopping"), self.store_timeout + 1)
        self.bus.close()
        self.calls.shutdown()

    def wake(self) -> None:
        self._wake.set()

    async def node_joined(self, node: NodeInfo) -> None:
        """A node of the inventory started counting: the core may place on it now."""
        if node.flavor not in self.config.flavors:
            log.warning("node %s has flavor %s, which no quota names", node.name, node.flavor)
            return

        def join() -> None:
            now = time.time()
            self.commit(self.core.add_node(node.flavor, node.name, node.gpus, now), now)
            self.commit(self.core.step(now), now)

        await self._run_if_leader(join)

    async def node_left(self, name: str, why: str) -> None:
        """A node stopped counting (gone, NotReady, cordoned): its holders lose their grants."""

        def leave() -> None:
            now = time.time()
            self.commit(self.core.remove_node(name, now), now)
            self.commit(self.core.step(now), now)

        log.warning("node %s left (%s): releasing its grants", name, why)
        await self._run_if_leader(leave)

    async def _run_if_leader(self, fn: Callable[[], None]) -> None:
        # A standby leaves nodes to the leader: its mirror (and a take-over's restore)
        # reads the inventory, which follows the joins and leaves itself.
        try:
            await self.run(fn)
        except NotLeader:
            pass

    # --- loops --------------------------------------------------------------------------

    async def _admission_loop(self) -> None:
        """Wake at the core's next deadline (or every `tick`) and step it."""
        while True:
            try:
                await self.run(self._step)
            except StoreUnavailable as e:
                log.debug("admission step not run: %s", e.message)
            except Exception:
                log.exception("admission step failed")
            await self._maybe_prune()
            # A standby's mirror has deadlines only the leader acts on: no busy wake-ups.
            deadline = self.engine.next_deadline() if self.leader else None
            delay = self.tick
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - time.time()))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay + 0.001)
            except asyncio.TimeoutError:
                pass

    def _step(self) -> None:
        now = time.time()
        self.commit(self.engine.step(now), now)

    async def _maybe_prune(self) -> None:
        """History retention: delete ended and rejected rows older than `retention`, a
        batch at a time (each a short transaction that never waits for a lock)."""
        if self.retention <= 0 or self.broken is not None or time.monotonic() < self._next_prune:
            return
        if not self.leader:
            return
        try:
            gone = await self.in_store(self.store.prune, time.time() - self.retention)
            if self.store.dialect == "sqlite":  # freed pages and the WAL: usable space
                await self.in_store(self.store.checkpoint)
        except StoreUnavailable as e:
            log.debug("pruning postponed: %s", e.message)
            gone = 0
        except Exception as e:
            log.warning("pruning the history failed: %s", describe(e))
            gone = 0
        if gone:
            log.info("pruned %d ended requests older than the retention", gone)
        # A full batch: more are due, soon; otherwise look again in a while (a minute, or
        # a tenth of the retention when that is shorter).
        pause = 1.0 if gone >= 1000 else min(60.0, max(1.0, self.retention / 10))
        self._next_prune = time.monotonic() + pause

    async def _sampling_loop(self) -> None:
        while True:
            try:
                loop = asyncio.get_running_loop()
                self.samples = await loop.run_in_executor(None, self.inventory.sample)
            except Exception:
                log.exception("device sampling failed")
            await asyncio.sleep(self.sample_interval)

    # --- the group commit and the store (group_commit.py, store_calls.py) ---------------

    async def run(self, operation: Callable[[], T]) -> T:
        """Run `operation` (which calls the core and `commit`) in the group commit's next
        cycle; its value once what it staged is committed and announced. A standby runs
        nothing: NotLeader."""
        if not self.leader:
            raise NotLeader(self.leader_url)
        return await self.group.run(operation)

    def _stage(self, fn: Callable[[], None]) -> list[Staged]:
        """What `fn` stages through `commit`, outside any group."""
        try:
            return self.group.staged_by(fn)
        finally:
            self._json_cache = {}

    async def in_store(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """`fn(*args)` in a store thread, awaited at most `timeout` (`store_timeout`)
        seconds: StoreUnresponsive past it (store_calls.py)."""
        return await self.calls.run(fn, *args, timeout=timeout)

    def read_now(self, fn: Callable[..., T], *args: Any) -> T:
        """A store read for a synchronous caller on the loop, at most half a second."""
        return self.calls.read_now(fn, *args)

    async def store_health(self) -> str:
        """`ok`, `failing` or `unresponsive` (store_calls.py)."""
        return await self.calls.health()

    async def settled(self) -> None:
        """Return once no group's write is in flight (group_commit.py)."""
        await self.group.settled()

    def check_available(self) -> None:
        """Raise StoreUnavailable while memory is dropped (see `rebuild`)."""
        if self.broken is not None:
            raise StoreUnavailable(f"the store is unavailable: {self.broken}")

    # What the group commit asks of its driver (group_commit.GroupDriver).

    async def available(self) -> StoreUnavailable | None:
        """Before a group: the stalls noted; while memory is dropped, a rebuild at most
        once a second, and until one succeeds every operation is answered 503."""
        self.stalls.observe()
        if self.broken is None:
            return None
        recent = time.monotonic() - self._last_rebuild < 1.0
        if not recent and await self.rebuild(self.broken or "the store was unavailable"):
            return None
        return StoreUnavailable(f"the store is unavailable: {self.broken}")

    def open_group(self) -> None:
        """Every group starts with the stalls' lease extension (first in its group: before
        any expiry), written with it."""
        self._json_cache = {}
        now = time.time()
        by = self.stalls.take()
        if by > 0 and self.lease_ttl > 0:
            moved = self.core.extend_leases(by)
            if moved:
                log.warning("extended %d leases by %.1f s", len(moved), by)
                self.commit([], now, extra=moved)

    def close_group(self) -> None:
        self._json_cache = {}

    def announce(self, staged: list[Staged]) -> None:
        for st in staged:
            self._announce(st)
        if staged:
            self._maybe_scale()

    def _reset_memory(self) -> None:
        """Forget everything the core decided: what is left is what the store says."""
        self.requests = {}
        self.keys = {}
        self.meta = {}
        self.hold_times = {}
        self.history = History()
        self._culled_at = {}
        self.estimates.forget()
        self._json_cache = {}
        self._last_desired = {}
        self.overrides = {}
        self.config = self.make_config(self.quotas)
        self.core = AdmissionCore(self.config)

    async def rebuild(self, why: str) -> bool:
        """Drop memory and rebuild the core from the store, as a restart would.

        On failure memory stays empty and `broken` says why: every route answers 503
        until a later attempt (each cycle, at most once a second) succeeds.
        """
        self.broken = why
        self._last_rebuild = time.monotonic()
        self._reset_memory()
        with self.group.unsettled():
            try:
                stored = await self.in_store(self.read_stored)
                now = time.time()
                staged = self._restored(now, stored)
                if staged:
                    for st in staged:
                        check_snapshot(st.snap)
                    await self.in_store(self.store.write_many, [st.snap for st in staged], 0.0)
                    self.announce(staged)
            except Exception as e:
                self._reset_memory()
                self.broken = f"{why}; rebuilding from the store failed: {describe(e)}"
                log.error(
                    "the gateway cannot rebuild from the store: %s (answering 503)", describe(e)
                )
                return False
        log.warning("rebuilt the core from the store after: %s", why)
        self.broken = None
        # The restore gave every lease a full TTL from now: no gap is owed any more.
        self.stalls.forgive()
        self.calls.forget_outage()
        return True

    # --- operations (each: core, stage; answered once committed and announced) ------------

    async def submit(
        self,
        *,
        tenant: str,
        user: str,
        kind: str,
        gpus: int,
        flavor: str | None = None,
        priority: int = 0,
        name: str | None = None,
        key: str | None = None,
    ) -> tuple[Request, dict[str, Any]]:
        """Submit; the request and its API object as of its own decision.

        With an Idempotency-Key already used by this user: `Duplicate`, with the request
        that key created (looked up in memory, then in the store)."""
        if key is not None:
            await self._raise_if_keyed(user, key)
        return await self.run(
            functools.partial(self._submit, tenant, user, kind, gpus, flavor, priority, name, key)
        )

    async def _raise_if_keyed(self, user: str, key: str) -> None:
        rid = self.keys.get((user, key))
        if rid is not None and rid in self.requests:
            await self.settled()
            raise Duplicate(self._json_of(self.requests[rid]))
        row = await self.in_store(self.store.find_key, user, key)
        if row is not None:
            await self.settled()
            live = self.requests.get(row.id)
            raise Duplicate(self.request_json(live if live is not None else row))

    def _submit(
        self,
        tenant: str,
        user: str,
        kind: str,
        gpus: int,
        flavor: str | None,
        priority: int,
        name: str | None,
        key: str | None = None,
    ) -> tuple[Request, dict[str, Any]]:
        now = time.time()
        if key is not None:  # the same key twice in one group: the first one's request
            rid = self.keys.get((user, key))
            if rid is not None and rid in self.requests:
                raise Duplicate(self._json_of(self.requests[rid]))
        req = Request(
            id=new_request_id(),
            tenant=tenant,
            user=user,
            kind=kind,
            gpus=gpus,
            submit_time=now,
            flavor=flavor,
            priority=priority,
        )
        # Its row, built and checked on its own before the core sees it: a value the
        # store cannot hold fails this submission alone (400), never its group.
        extra = {"name": name, "utilization": None, "created": now, "idempotency_key": key}
        check_snapshot(snapshot(Batch([(req, extra)], []), now))
        # The engine first: one that takes no submissions (Kueue's) refuses before memory
        # holds the request.
        decisions = list(self.engine.submit(req, now))
        self.requests[req.id] = req
        self.meta[req.id] = {"name": name, "created": now, "updated": now}
        if key is not None:
            self.meta[req.id]["idempotency_key"] = key
            self.keys[(user, key)] = req.id
        if req.state is not State.REJECTED:
            decisions += self.engine.step(now)
        self.commit(decisions, now, extra=[req])
        return req, self._json_of(req)

    async def cancel(self, rid: str, who: str) -> tuple[Request, dict[str, Any]]:
        return await self.run(functools.partial(self._cancel, rid, who))

    def _cancel(self, rid: str, who: str) -> tuple[Request, dict[str, Any]]:
        now = time.time()
        req = self._live(rid)
        if req.state is State.ADMITTED:
            decisions = self.engine.finish(rid, now, reason=ended_by("released", who, req.user))
        else:
            decisions = self.engine.cancel(rid, now, reason=ended_by("cancelled", who, req.user))
        decisions += self.engine.step(now)
        self.commit(decisions, now, extra=[req])
        return req, self._json_of(req)

    async def heartbeat(
        self, rid: str, busy: bool, utilization: float | None, uuids: list[str] | None = None
    ) -> tuple[Request, dict[str, Any]]:
        return await self.run(functools.partial(self._heartbeat, rid, busy, utilization, uuids))

    def _heartbeat(
        self, rid: str, busy: bool, utilization: float | None, uuids: list[str] | None = None
    ) -> tuple[Request, dict[str, Any]]:
        now = time.time()
        req = self._live(rid)
        if req.state is not State.ADMITTED:
            raise Conflict(f"request {rid} is {req.state.value}, not admitted")
        was_busy, idle_since = req.busy, req.idle_since
        decisions = self.engine.heartbeat(rid, now, busy=busy)
        decisions += self.engine.step(now)
        meta = self.meta[rid]
        meta["utilization"] = utilization
        if utilization is not None:
            peak = meta.get("peak_utilization")
            meta["peak_utilization"] = utilization if peak is None else max(peak, utilization)
        if uuids is not None:
            # The GPUs the holder sees (Kubernetes: the device plugin's choice, which only
            # the pod knows): for gpuaas_grant_info alone, so kept in memory like the
            # device samples, and reported again by the next heartbeat after a restart.
            meta["uuids"] = tuple(uuids[: req.gpus])
        # A change of busy/idle is kept for `history export` (the request's busy intervals).
        activity = [(rid, busy, utilization)] if busy != was_busy else []
        # An idle spell that ended before the cull: how long idle holders stay idle, for
        # the estimates (`History.busy_before_cull`), once that is committed.
        after = []
        if busy and idle_since is not None:
            spell = functools.partial(self.history.busy_again, req.kind, now - idle_since, now)
            after.append(spell)
        # The renewed lease is written even without decisions: after a restart the
        # holder must not lose a grant it kept renewing.
        self.commit(decisions, now, extra=[req], activity=activity, after=after)
        return req, self._json_of(req)

    async def put_tenant(self, name: str, spec: Mapping[str, Any]) -> Config:
        """Replace one tenant's spec; raises SpecError (naming `tenants.<name>...`)."""
        return await self.run(functools.partial(self._put_tenant, name, dict(spec)))

    def _put_tenant(self, name: str, spec: dict[str, Any]) -> Config:
        now = time.time()
        overrides = {**self.overrides, name: spec}
        config = self.make_config(self.quotas, overrides)
        check_snapshot(snapshot(Batch([], [], tenants=[(name, spec)]), now))
        try:
            decisions = self.core.update_config(config, now)
        except ValueError as e:  # nothing changed
            raise Conflict(str(e)) from None
        self.config = config
        self.overrides = overrides
        self.commit(decisions + self.core.step(now), now, tenants=[(name, spec)])
        return config

    def owner_of(self, rid: str) -> str | None:
        """Who submitted `rid` (None: no such request), without building its view."""
        live = self.requests.get(rid)
        if live is not None:
            return live.user
        row = self.read_now(self.store.get, rid)
        return None if row is None else row.user

    def _live(self, rid: str) -> Request:
        req = self.requests.get(rid)
        if req is None or req.state in TERMINAL:
            raise Conflict(f"request {rid} has already ended")
        return req

    # --- views (views.py: functions of the core's state) ----------------------------------

    def core_state(self) -> CoreState:
        """What the views read, as memory stands (no copy: the views only read)."""
        return CoreState(
            config=self.config,
            core=self.core,
            engine=self.engine,
            inventory=self.inventory,
            requests=self.requests,
            meta=self.meta,
            samples=self.samples,
            hold_times=self.hold_times,
            history=self.history,
            estimates=self.estimates,
            forward=self.core if self.kueue is None else self.kueue.forward_core,
        )

    def view(self, rid: str) -> dict[str, Any] | None:
        """The request object of `rid`: live from memory, else from the store."""
        live = self.requests.get(rid)
        if live is not None:
            return self.request_json(live)
        row = self.read_now(self.store.get, rid)
        return None if row is None else self.request_json(row)

    def request_json(self, req: Request | RequestRow) -> dict[str, Any]:
        """The API's request object, from a live request or a stored row."""
        return views.request_json(self.core_state(), req)

    def devices_json(self) -> dict[str, Any]:
        return views.devices_json(self.core_state())

    def tenants_json(self) -> dict[str, Any]:
        return views.tenants_json(self.core_state())

    def snapshot_metrics(self) -> None:
        """The gauges set from the core as it stands (views.metric_snapshot)."""
        # MetricSnapshot's fields are set_snapshot's arguments, in their order.
        self.metrics.set_snapshot(*views.metric_snapshot(self.core_state()), leader=self.leader)

    # --- persistence and announcement ----------------------------------------------------

    def commit(
        self,
        decisions: Sequence[Decision],
        now: float,
        extra: Iterable[Request] = (),
        tenants: Sequence[tuple[str, dict[str, Any]]] = (),
        activity: Sequence[tuple[str, bool, float | None]] = (),
        after: Sequence[Callable[[], None]] = (),
    ) -> None:
        """Stage decisions and the requests they touch: written in one transaction with
        the rest of this cycle's group, and announced only once that committed (`after`:
        more of what memory learns then, beside the decisions' own `_account`).

        Everything announced (the rows, the SSE data, the metrics) is taken now, as of
        this batch: later batches of the group do not leak into its announcement.
        """
        if not self.group.staging:
            raise RuntimeError("Arbiter.commit outside an operation (use run or _stage)")
        touched: dict[str, Request] = {r.id: r for r in extra}
        for d in decisions:
            if d.id is not None and d.id in self.requests:
                touched.setdefault(d.id, self.requests[d.id])
                self._say_ending(d, self.requests[d.id])
        if not touched and not decisions and not tenants:
            return
        self._json_cache = {}
        self.estimates.forget()
        nodes_added: list[tuple[str, str, int]] = []
        nodes_removed: list[str] = []
        if self.scaler.manages_provisioning:
            gpus_of = {n.name: n.gpus for n in self.core.nodes()}
            for d in decisions:
                if d.event == "node_ready":
                    node = str(d.fields["node"])
                    flavor = str(d.fields["flavor"])
                    gpus = gpus_of.get(node, self.config.flavors[flavor].gpus_per_node)
                    nodes_added.append((node, flavor, gpus))
                elif d.event == "scale_down":
                    nodes_removed.append(str(d.fields["node"]))
        rows = []
        for req in touched.values():
            meta = self.meta.setdefault(req.id, {"created": now})
            meta["updated"] = now
            extra_cols = {"name": meta.get("name"), "utilization": meta.get("utilization")}
            if meta.get("peak_utilization") is not None:
                extra_cols["peak_utilization"] = meta["peak_utilization"]
            if "created" in meta:
                extra_cols["created"] = meta["created"]
            if "idempotency_key" in meta:
                extra_cols["idempotency_key"] = meta["idempotency_key"]
            rows.append((req, extra_cols))
        snap = snapshot(
            Batch(
                rows,
                decisions,
                nodes_added=nodes_added,
                nodes_removed=nodes_removed,
                tenants=list(tenants),
                activity=list(activity),
            ),
            now,
        )
        events: list[Event] = []
        accounts: list[Callable[[], None]] = list(after)
        for d in decisions:
            accounts += self._account(d)
            about = self.requests.get(d.id) if d.id else None
            data = d.to_json()
            if about is not None:
                data["request"] = self._json_of(about)
            events.append(Event(d.event, data, user=about.user if about else None))
        ended = [rid for rid, req in touched.items() if req.state in TERMINAL]
        self.group.stage(Staged(snap, events, accounts, nodes_added, nodes_removed, ended))

    def _json_of(self, req: Request) -> dict[str, Any]:
        """`request_json` of a live request as of the last staged batch (computed once)."""
        out = self._json_cache.get(req.id)
        if out is None:
            out = self._json_cache[req.id] = self.request_json(req)
        return out

    def _say_ending(self, d: Decision, req: Request) -> None:
        """An end the core records without words (a preemption names the preemptor's id, a
        cull or an expiry nothing) gets its reason in words before it is stored: what the
        spawn page, the sidebar and `%gpu status` show (words.ending_sentence)."""
        if d.event == "preempt" and req.state is State.PREEMPTED:
            by = self.requests.get(str(d.fields.get("by")))
            req.reason = preempted_reason(
                req.tenant, req.gpus, by.tenant if by else None, by.gpus if by else None
            )
        elif d.event == "cull" and req.state is State.CULLED:
            req.reason = culled_reason(idle_timeout(self.config, req.tenant))
        elif d.event == "expire" and req.state is State.CULLED:
            tenant = self.config.tenants.get(req.tenant)
            ttl = tenant.reservation_ttl if tenant and tenant.reservation_ttl is not None else None
            req.reason = expired_reason(self.config.policy.reservation_ttl if ttl is None else ttl)

    def _announce(self, st: Staged) -> None:
        """Committed: now the world may hear of it."""
        for name, flavor, gpus in st.nodes_added:
            self.scaler.node_ready(flavor, name, gpus)
        for name in st.nodes_removed:
            self.scaler.node_removed(name)
        for account in st.accounts:
            account()
        for event in st.events:
            self.bus.publish(event)
        for rid in st.ended:
            req = self.requests.get(rid)
            if req is not None and req.state in TERMINAL:
                self.requests.pop(rid, None)
                meta = self.meta.pop(rid, None)
                if meta and "idempotency_key" in meta:  # the store answers for it now
                    self.keys.pop((req.user, meta["idempotency_key"]), None)

    def _account(self, d: Decision) -> list[Callable[[], None]]:
        """The metrics and hold times a decision changes, applied once it is committed."""
        out: list[Callable[[], None]] = []
        req = self.requests.get(d.id) if d.id else None
        if req is None:
            return out
        if d.event == "submit":
            out.append(functools.partial(self.estimates.submitted, req))
        elif d.event == "requeue" and req.queue_time != req.submit_time:
            # A culled request's user back after its reservation went (a preempted one is
            # queued again by its submit time): an arrival to the queue, forecast as one.
            out.append(functools.partial(self.estimates.came_back, req, d.t))
        elif d.event == "admit":
            out.append(functools.partial(self.estimates.started, req.id, d.t))
        elif d.event in ("cancel", "reject"):
            out.append(functools.partial(self.estimates.left, req.id))
        if d.event == "admit" and "resumed_from" not in d.fields:
            if req.admit_time is not None and req.first_admit == req.admit_time:
                wait = d.t - req.submit_time
                out.append(functools.partial(self.metrics.observe_wait, req.tenant, req.kind, wait))
        elif d.event == "cull":
            out.append(functools.partial(self.metrics.inc_culled, req.tenant, req.kind))
        elif d.event == "preempt":
            out.append(functools.partial(self.metrics.inc_preempted, req.tenant, req.kind))
        elif d.event == "finish" and d.fields.get("reason") == LEASE_EXPIRED:
            out.append(functools.partial(self.metrics.inc_lease_expired, req.tenant, req.kind))
        # A parked reservation's user back (a busy heartbeat resumes it, or a new request
        # of theirs claims it, admission/releases.py): how long after the cull, for the
        # estimates' `History.comes_back`.
        if d.event == "cull" and d.fields.get("parked"):
            out.append(functools.partial(self._culled_at.__setitem__, req.id, d.t))
        elif d.event == "resume" or "claimed_by" in d.fields:
            out.append(functools.partial(self._came_back, req.kind, req.id, d.t))
        elif d.event in ("finish", "cancel", "expire", "preempt"):
            out.append(functools.partial(self._not_back, req.id))
        if d.event in ("finish", "cancel", "preempt") and req.admit_time:
            flavor = req.assigned_flavor
            if flavor:
                out.append(functools.partial(self._held, flavor, max(0.0, d.t - req.admit_time)))
        # A hold lasts until the quota goes back: a cull that parks keeps it, and so
        # does a new request of its user that takes the parked reservation over (it goes
        # on with the hold: `Request.held_since`). A preempted run is no sample of a
        # hold: the core cut it short (a preempted job runs again from the start, and
        # its complete run counts), and a forward run makes its own preemptions
        # (sim/backtest.py `Backtest.observe`, the same rule).
        ends_hold = (
            d.event in ("finish", "cancel", "expire") and "claimed_by" not in d.fields
        ) or (d.event == "cull" and not d.fields.get("parked"))
        if ends_hold and req.admit_time:
            held = max(0.0, d.t - session_start(req, req.admit_time))
            # Whether its user came back after its culls (those of this hold): the
            # estimates' `comes_back`.
            gave_up = d.event in ("expire", "cull")
            add = functools.partial(
                self.history.add, req.kind, req.user, held, req.culls, gave_up, d.t
            )
            out.append(add)
        return out

    def _not_back(self, rid: str) -> None:
        self._culled_at.pop(rid, None)

    def _came_back(self, kind: str, rid: str, t: float) -> None:
        culled = self._culled_at.pop(rid, None)
        if culled is not None:
            self.history.came_back(kind, t - culled, t)

    def _held(self, flavor: str, seconds: float) -> None:
        times = self.hold_times.setdefault(flavor, [])
        times.append(seconds)
        del times[:-200]

    def _maybe_scale(self) -> None:
        self.scaler.queue_changed(self.core)  # per-head scale-up (ProvisioningRequests)
        desired = dict(self.core.desired_nodes())
        ready: dict[str, int] = {}
        for node in self.core.nodes():
            ready[node.flavor] = ready.get(node.flavor, 0) + 1
        # Ready counts too: a joined node leaves `desired` as it was but ends a scale-up.
        if (desired, ready) == (self._last_desired, self._last_ready):
            return
        self._last_desired, self._last_ready = desired, ready
        try:
            asyncio.get_running_loop().create_task(self.scaler.apply(desired, ready))
        except RuntimeError:  # no loop (restore before serving): the next change applies
            self._last_desired = {}


def check_names(config: Config) -> None:
    """Tenant, cohort and flavor names follow validate.py's one rule (SpecError if not)."""
    for flavor in config.flavors:
        if not is_name(flavor):
            raise SpecError(f"flavors.{flavor}", f"is not a valid name: {NAME_RULE}")
    for name, tenant in config.tenants.items():
        if not is_name(name):
            raise SpecError(f"tenants.{name}", f"is not a valid name: {NAME_RULE}")
        if tenant.cohort is not None and not is_name(tenant.cohort):
            raise SpecError(f"tenants.{name}.cohort", f"is not a valid name: {NAME_RULE}")


__all__ = ["Arbiter", "Conflict", "Duplicate", "SpecError", "new_request_id"]
