"""The core's driver: the wall clock, persistence, announcements and the loops.

Every change goes the same way: call the admission core (it decides), write the decisions
and the request rows they changed in one transaction, commit, and only then tell anyone
(the HTTP answer, SSE listeners, metrics, the scaler). The core is rebuilt from the store
on start (`restore`), so a crash at any instant leaves a state the core was really in.

Group commit. Operations (submit, cancel, heartbeat, a quota change, an admission step)
are queued and run together by one `_cycle` on the event loop's thread, scheduled once per
loop iteration: it runs every queued operation against the core in arrival order (each
staging a copy of its batch), writes the whole group in ONE transaction, and once that
committed announces every batch in order and answers every operation. Under load one
commit (one fsync) covers every request that arrived in the same loop iteration. The
write is done inline, not in a thread: a writer thread would hand the GIL back and forth
with the busy loop (each handover up to the 5 ms switch interval) and the cycle, not the
disk, would become the bottleneck. The core never holds a decision the store has not
committed once a cycle returns, so readers need no lock.

Failures (the store is the truth). A cycle first takes the store's write lock
(`Store.begin_write`): when another process holds it, or the database is unreachable, the
cycle touches nothing and is retried shortly without blocking the loop (answering 503
once `lock_timeout` has passed). Each operation's rows are checked on their own
(`check_snapshot`, and the new request's row before the core sees it): a bad one fails
alone with a 400, the batches before it are committed, and the core is rebuilt from the
store before the next operation runs. When the group write itself fails (a full disk, a
server gone mid-transaction), every operation of the group is answered 503 and the core
is rebuilt from the store (`_rebuild`) before anything else is answered; while the store
cannot be read, the arbiter is `broken`: memory is dropped and every route answers 503
until a rebuild succeeds. Any decision kind staged through `commit` gets all of this.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from jupyter_gpuaas.admission.config import SpecError, parse_config
from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.model import (
    TERMINAL,
    Autoscale,
    Config,
    Decision,
    Flavor,
    Request,
    State,
)

from ..devices import DeviceSample, Inventory, NodeInfo
from . import waits
from .events import Event, EventBus
from .grace import grace_of, preempt_reason, preemption_fields, reclaim_wait
from .leader import NotLeader
from .metrics import GatewayMetrics, PendingCount, TenantUsage
from .positions import QueueIndex
from .scalers import Scaler
from .store import (
    Batch,
    RequestRow,
    RowError,
    Snapshot,
    Store,
    StoreBusy,
    StoreUnavailable,
    WriteTx,
    check_snapshot,
    describe,
    row_to_request,
    snapshot,
)
from .validate import NAME_RULE, InputError, is_name

log = logging.getLogger("jupyter_gpuaas.gateway")


class Conflict(Exception):
    """The request is in a state where the operation makes no sense (HTTP 409)."""


# What an operation may raise having decided nothing (its answer stands as is). Anything
# else may have left the core half-changed: the core is rebuilt from the store.
_CLEAN_ERRORS = (Conflict, SpecError, InputError)


def new_request_id() -> str:
    return "r-" + uuid.uuid4().hex[:16]


T = TypeVar("T")


@dataclass
class _Staged:
    """One decided batch, waiting for its group's commit before it is announced."""

    snap: Snapshot
    events: list[Event]
    accounts: list[Callable[[], None]]
    nodes_added: list[tuple[str, str, int]]
    nodes_removed: list[str]
    ended: list[str]


@dataclass
class _Op:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    outcome: tuple[bool, Any] = (False, None)  # (ok, value or exception)


@dataclass
class _Group:
    ops: list[_Op] = field(default_factory=list)
    staged: list[_Staged] = field(default_factory=list)


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
    ) -> None:
        self.quotas = dict(quotas)
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
        # Why memory was dropped (the store could not be read back), or None.
        self.broken: str | None = None
        # Two gateways, one leader (leader.py): a standby mirrors the store and decides
        # nothing; `leader_url` is who leads, when known. One gateway: always the leader.
        self.leader = True
        self.leader_url: str | None = None
        self._last_rebuild = 0.0
        self._busy_since: float | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._next_prune = 0.0
        # Requests handed to the core, by id, while live (the core mutates them).
        self.requests: dict[str, Request] = {}
        # What the API adds to a request: name, created, updated, utilization.
        self.meta: dict[str, dict[str, Any]] = {}
        self.samples: list[DeviceSample] = []
        self.hold_times: dict[str, list[float]] = {}
        self._last_desired: dict[str, int] = {}
        self._last_ready: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Group commit: operations waiting for the next cycle, and where the running one
        # stages its batches (see the module docstring).
        self._ops: list[_Op] = []
        self._staging: list[_Staged] | None = None
        self._cycle_scheduled = False
        self._json_cache: dict[str, dict[str, Any]] = {}
        # Positions and running grants, in step with the committed batches.
        self.index = QueueIndex()
        check_names(parse_config(self.quotas))  # SpecError: the file breaks the name rule
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
        policy = dataclasses.replace(config.policy, lease_ttl=self.lease_ttl, autoscale=autoscale)
        return dataclasses.replace(config, flavors=flavors, policy=policy)  # keeps cohorts

    def autoscale(self, flavor: str) -> Autoscale | None:
        return self.config.policy.autoscale.get(flavor)

    # --- start and stop -----------------------------------------------------------------

    def restore(self, now: float, *, lock_wait: float | None = None) -> None:
        """Rebuild the core from the inventory and the store, then run one step.

        Its decisions are committed waiting up to `lock_wait` seconds for a lock held
        elsewhere (`lock_timeout` at start; a rebuild on the event loop does not wait)."""
        decisions = self._load(now)
        wait = self.lock_timeout if lock_wait is None else lock_wait
        self._commit_now(lambda: self.commit(decisions + self.core.step(now), now), wait)
        log.info(
            "restored %d live requests on %d nodes", len(self.requests), len(self.core.nodes())
        )

    def _load(self, now: float) -> list[Decision]:
        """Load nodes and live requests into the core; the decisions it made doing so."""
        decisions: list[Decision] = []
        known = set(self.config.flavors)
        # Nodes the simulated scaler added are in the store (and, when this is a rebuild
        # rather than a start, in the inventory too): they stay autoscaled.
        stored_nodes = self.store.nodes() if self.scaler.manages_provisioning else []
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
        for row in self.store.live_requests():
            req = row_to_request(row)
            self.meta[req.id] = _meta_of(row)
            if req.state is State.ADMITTED and self.lease_ttl > 0:
                # Holders could not heartbeat while the gateway was down: a fresh lease.
                req.lease_expires = max(req.lease_expires or 0.0, now + self.lease_ttl)
            self.requests[req.id] = req
            # A grant whose node or devices are gone comes back as a `finish` decision.
            decisions += self.core.restore(req, now)
        for req in self.requests.values():
            self.index.sync(req)
        for flavor, seconds in self.store.ended_hold_times():
            self.hold_times.setdefault(flavor, []).append(seconds)
        return decisions

    # --- leadership (leader.py) -----------------------------------------------------------

    def follow(self, leader_url: str | None) -> None:
        """Be a standby: decide nothing, refuse changes, mirror the store for reads."""
        self.leader, self.leader_url = False, leader_url
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._fail_queued(NotLeader(leader_url))
        self.refresh_mirror()

    def refresh_mirror(self) -> None:
        """A standby's view: the store as it is now, loaded as `restore` loads it, but
        nothing is committed or announced (its own decisions, if any, are the leader's
        to make)."""
        if self.leader:
            return
        self._reset_memory()
        try:
            self.overrides = self.store.tenant_overrides()
            self.config = self.make_config(self.quotas, self.overrides)
            self.core = AdmissionCore(self.config)
            self._load(time.time())
            self.broken = None
        except Exception as e:
            self._reset_memory()
            self.broken = f"the standby cannot read the store: {describe(e)}"

    def take_over(self) -> None:
        """Leadership won: restore from the store exactly as at start-up, then decide."""
        self.leader, self.leader_url = True, None
        self._rebuild("this gateway took over as the leader")
        self.wake()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._admission_loop()),
            loop.create_task(self._sampling_loop()),
        ]
        follow = getattr(self.inventory, "follow", None)
        if follow is not None:  # an inventory that sees nodes join and leave (cluster.py)
            self._tasks.append(loop.create_task(follow(self.node_joined, self.node_left)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._ops:
            self._cycle()
        if self._retry is not None:  # still locked: these will not be decided
            self._retry.cancel()
            self._fail_queued(StoreUnavailable("the gateway is stopping"))
        self.bus.close()

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
            await self._run(fn)
        except NotLeader:
            pass

    async def _admission_loop(self) -> None:
        """Wake at the core's next deadline (or every `tick`) and step it."""
        while True:
            try:
                await self._run(self._step)
            except StoreUnavailable as e:
                log.debug("admission step not run: %s", e.message)
            except Exception:
                log.exception("admission step failed")
            self._maybe_prune()
            # A standby's mirror has deadlines only the leader acts on: no busy wake-ups.
            deadline = self.core.next_deadline() if self.leader else None
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
        self.commit(self.core.step(now), now)

    def _maybe_prune(self) -> None:
        """History retention: delete ended and rejected rows older than `retention`, a
        batch at a time (each a short transaction that never waits for a lock)."""
        if self.retention <= 0 or self.broken is not None or time.monotonic() < self._next_prune:
            return
        if not self.leader:
            return
        try:
            gone = self.store.prune(time.time() - self.retention)
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

    # --- group commit ---------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        """Run `fn` (which calls the core and `commit`) in the next cycle; its value once
        everything it staged is committed and announced. Its exception as is."""
        if not self.leader:
            raise NotLeader(self.leader_url)
        op = _Op(fn, asyncio.get_running_loop().create_future())
        self._ops.append(op)
        self._schedule_cycle()
        result: T = await op.future
        return result

    def _schedule_cycle(self) -> None:
        # While waiting for a lock held elsewhere, one timer retries (operations queue).
        if not self._cycle_scheduled and self._retry is None:
            self._cycle_scheduled = True
            asyncio.get_running_loop().call_soon(self._cycle)

    def _retry_cycle(self) -> None:
        self._retry = None
        self._schedule_cycle()

    def _cycle(self) -> None:
        """Run every queued operation, commit what they staged as one group, announce.

        See "Failures" in the module docstring for what happens when the store refuses.
        """
        self._cycle_scheduled = False
        if not self._ops:
            return
        if self.broken is not None and not self._try_rebuild():
            self._fail_queued(StoreUnavailable(f"the store is unavailable: {self.broken}"))
            return
        try:
            tx = self.store.begin_write()
        except StoreBusy as e:
            now = time.monotonic()
            if self._busy_since is None:
                self._busy_since = now
            if now - self._busy_since < self.lock_timeout:
                # Nothing touched: the operations wait, the loop serves others meanwhile.
                self._retry = asyncio.get_running_loop().call_later(0.05, self._retry_cycle)
                return
            self._busy_since = None
            self._fail_queued(e)
            return
        except StoreUnavailable as e:
            log.warning("%s: %d operations answered 503", e.message, len(self._ops))
            self._fail_queued(e)
            return
        self._busy_since = None
        ops, self._ops = self._ops, []
        self._run_group(tx, ops)

    def _fail_queued(self, error: Exception) -> None:
        ops, self._ops = self._ops, []
        for op in ops:
            op.outcome = (False, error)
        self._answer(_Group(ops))

    def _run_group(self, tx: WriteTx, ops: list[_Op]) -> None:
        """Run `ops` on the core inside `tx`; commit, announce and answer them."""
        group = _Group()
        self._json_cache = {}
        suspect: str | None = None  # why the core must be rebuilt after this group
        for i, op in enumerate(ops):
            mark = len(group.staged)
            self._staging = group.staged
            try:
                op.outcome = (True, op.fn())
            except _CLEAN_ERRORS as e:
                op.outcome = (False, e)
            except Exception as e:
                log.exception("an operation failed after changing the core")
                op.outcome = (False, StoreUnavailable(f"the gateway failed: {e}"))
                suspect = f"operation failed: {e}"
            finally:
                self._staging = None
            group.ops.append(op)
            if suspect is None:
                try:
                    for st in group.staged[mark:]:
                        check_snapshot(st.snap)
                except RowError as e:
                    # The core took this operation's decisions, the store cannot: drop
                    # them, commit those before it, rebuild, and run the rest after.
                    log.warning("refused an operation whose rows cannot be stored: %s", e)
                    op.outcome = (False, e)
                    suspect = f"rows of one operation refused: {e}"
            if suspect is not None:
                del group.staged[mark:]
                self._ops[:0] = ops[i + 1 :]
                break
        self._json_cache = {}
        committed = self._write_group(tx, group)
        if committed:
            for st in group.staged:
                self._announce(st)
            if group.staged:
                self._maybe_scale()
        else:
            suspect = "a group write failed"
        if suspect is not None:
            self._rebuild(suspect)
        self._answer(group)
        if self._ops:
            self._schedule_cycle()

    def _write_group(self, tx: WriteTx, group: _Group) -> bool:
        """Write and commit the group's batches; False (every answer a 503) if it failed."""
        if not group.staged:
            tx.rollback()  # nothing to write: just release the lock
            return True
        try:
            tx.write([st.snap for st in group.staged])
            tx.commit()
            return True
        except Exception as e:
            tx.rollback()
            why = describe(e)
            log.error(
                "the store failed to record %d batches (%s): not announced; rebuilding the "
                "core from the store",
                len(group.staged),
                why,
            )
            err = StoreUnavailable(f"the store could not record this, nothing changed: {why}")
            for op in group.ops:
                if not isinstance(op.outcome[1], InputError):
                    op.outcome = (False, err)
            return False

    def _reset_memory(self) -> None:
        """Forget everything the core decided: what is left is what the store says."""
        self.requests = {}
        self.meta = {}
        self.index = QueueIndex()
        self.hold_times = {}
        self._json_cache = {}
        self._last_desired = {}
        self.overrides = {}
        self.config = self.make_config(self.quotas)
        self.core = AdmissionCore(self.config)

    def _rebuild(self, why: str) -> bool:
        """Drop memory and rebuild the core from the store, as a restart would.

        On failure memory stays empty and `broken` says why: every route answers 503
        until a later attempt (each cycle, at most once a second) succeeds.
        """
        self.broken = why
        self._last_rebuild = time.monotonic()
        self._reset_memory()
        try:
            self.overrides = self.store.tenant_overrides()
            self.config = self.make_config(self.quotas, self.overrides)
            self.core = AdmissionCore(self.config)
            self.restore(time.time(), lock_wait=0.0)
        except Exception as e:
            self._reset_memory()
            self.broken = f"{why}; rebuilding from the store failed: {describe(e)}"
            log.error("the gateway cannot rebuild from the store: %s (answering 503)", describe(e))
            return False
        log.warning("rebuilt the core from the store after: %s", why)
        self.broken = None
        return True

    def _try_rebuild(self) -> bool:
        if time.monotonic() - self._last_rebuild < 1.0:
            return False
        return self._rebuild(self.broken or "the store was unavailable")

    def check_available(self) -> None:
        """Raise StoreUnavailable while memory is dropped (see `_rebuild`)."""
        if self.broken is not None:
            raise StoreUnavailable(f"the store is unavailable: {self.broken}")

    @staticmethod
    def _answer(group: _Group) -> None:
        for op in group.ops:
            if op.future.done():
                continue
            ok, value = op.outcome
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)

    def _commit_now(self, fn: Callable[[], None], wait: float = 0.0) -> None:
        """Stage, write and announce synchronously (restore, before the loop serves)."""
        staged: list[_Staged] = []
        self._staging = staged
        try:
            fn()
        finally:
            self._staging = None
            self._json_cache = {}
        if staged:
            for st in staged:
                check_snapshot(st.snap)
            self.store.write_many([st.snap for st in staged], wait=wait)
            for st in staged:
                self._announce(st)
            self._maybe_scale()

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
    ) -> tuple[Request, dict[str, Any]]:
        """Submit; the request and its API object as of its own decision."""
        return await self._run(
            functools.partial(self._submit, tenant, user, kind, gpus, flavor, priority, name)
        )

    def _submit(
        self,
        tenant: str,
        user: str,
        kind: str,
        gpus: int,
        flavor: str | None,
        priority: int,
        name: str | None,
    ) -> tuple[Request, dict[str, Any]]:
        now = time.time()
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
        extra = {"name": name, "utilization": None, "created": now}
        check_snapshot(snapshot(Batch([(req, extra)], []), now))
        self.requests[req.id] = req
        self.meta[req.id] = {"name": name, "created": now, "updated": now}
        # A user coming back within the reservation TTL takes over their parked quota
        # (the core looks for it by scanning every live request: only when there is one).
        claim = self.index.has_parked(user)
        decisions = list(self.core.submit(req, now, claim_parked=claim))
        if req.state is not State.REJECTED:
            decisions += self.core.schedule(now)
        self.commit(decisions, now, extra=[req])
        return req, self._json_of(req)

    async def cancel(self, rid: str, who: str) -> tuple[Request, dict[str, Any]]:
        return await self._run(functools.partial(self._cancel, rid, who))

    def _cancel(self, rid: str, who: str) -> tuple[Request, dict[str, Any]]:
        now = time.time()
        req = self._live(rid)
        if req.state is State.ADMITTED:
            decisions = self.core.finish(rid, now, reason=f"released by {who}")
        else:
            decisions = self.core.cancel(rid, now)
        decisions += self.core.schedule(now)
        self.commit(decisions, now, extra=[req])
        return req, self._json_of(req)

    async def heartbeat(
        self, rid: str, busy: bool, utilization: float | None
    ) -> tuple[Request, dict[str, Any]]:
        return await self._run(functools.partial(self._heartbeat, rid, busy, utilization))

    def _heartbeat(
        self, rid: str, busy: bool, utilization: float | None
    ) -> tuple[Request, dict[str, Any]]:
        now = time.time()
        req = self._live(rid)
        if req.state is not State.ADMITTED:
            raise Conflict(f"request {rid} is {req.state.value}, not admitted")
        decisions = self.core.heartbeat(rid, now, busy=busy)
        decisions += self.core.schedule(now)
        self.meta[rid]["utilization"] = utilization
        # The renewed lease is written even without decisions: after a restart the
        # holder must not lose a grant it kept renewing.
        self.commit(decisions, now, extra=[req])
        return req, self._json_of(req)

    async def put_tenant(self, name: str, spec: Mapping[str, Any]) -> Config:
        """Replace one tenant's spec; raises SpecError (naming `tenants.<name>...`)."""
        return await self._run(functools.partial(self._put_tenant, name, dict(spec)))

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
        self.commit(decisions + self.core.schedule(now), now, tenants=[(name, spec)])
        return config

    def owner_of(self, rid: str) -> str | None:
        """Who submitted `rid` (None: no such request), without building its view."""
        live = self.requests.get(rid)
        if live is not None:
            return live.user
        row = self.store.get(rid)
        return None if row is None else row.user

    def _live(self, rid: str) -> Request:
        req = self.requests.get(rid)
        if req is None or req.state in TERMINAL:
            raise Conflict(f"request {rid} has already ended")
        return req

    # --- persistence and announcement ----------------------------------------------------

    def commit(
        self,
        decisions: Sequence[Decision],
        now: float,
        extra: Iterable[Request] = (),
        tenants: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> None:
        """Stage decisions and the requests they touch: written in one transaction with
        the rest of this cycle's group, and announced only once that committed.

        Everything announced (the rows, the SSE data, the metrics) is taken now, as of
        this batch: later batches of the group do not leak into its announcement.
        """
        if self._staging is None:
            raise RuntimeError("Arbiter.commit outside an operation (use _run or _commit_now)")
        touched: dict[str, Request] = {r.id: r for r in extra}
        for d in decisions:
            if d.id is not None and d.id in self.requests:
                touched.setdefault(d.id, self.requests[d.id])
        if not touched and not decisions and not tenants:
            return
        self._json_cache = {}
        for req in touched.values():
            self.index.sync(req)
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
            if "created" in meta:
                extra_cols["created"] = meta["created"]
            rows.append((req, extra_cols))
        snap = snapshot(
            Batch(
                rows,
                decisions,
                nodes_added=nodes_added,
                nodes_removed=nodes_removed,
                tenants=list(tenants),
            ),
            now,
        )
        events: list[Event] = []
        accounts: list[Callable[[], None]] = []
        for d in decisions:
            accounts += self._account(d)
            about = self.requests.get(d.id) if d.id else None
            data = d.to_json()
            if about is not None:
                data["request"] = self._json_of(about)
            events.append(Event(d.event, data, user=about.user if about else None))
        ended = [rid for rid, req in touched.items() if req.state in TERMINAL]
        self._staging.append(_Staged(snap, events, accounts, nodes_added, nodes_removed, ended))

    def _json_of(self, req: Request) -> dict[str, Any]:
        """`request_json` of a live request as of the last staged batch (computed once)."""
        out = self._json_cache.get(req.id)
        if out is None:
            out = self._json_cache[req.id] = self.request_json(req)
        return out

    def _announce(self, st: _Staged) -> None:
        """Committed: now the world may hear of it."""
        for name, flavor, gpus in st.nodes_added:
            self.scaler.node_ready(flavor, name, gpus)  # type: ignore[attr-defined]
        for name in st.nodes_removed:
            self.scaler.node_removed(name)  # type: ignore[attr-defined]
        for account in st.accounts:
            account()
        for event in st.events:
            self.bus.publish(event)
        for rid in st.ended:
            req = self.requests.get(rid)
            if req is not None and req.state in TERMINAL:
                self.requests.pop(rid, None)
                self.meta.pop(rid, None)

    def _account(self, d: Decision) -> list[Callable[[], None]]:
        """The metrics and hold times a decision changes, applied once it is committed."""
        out: list[Callable[[], None]] = []
        req = self.requests.get(d.id) if d.id else None
        if req is None:
            return out
        if d.event == "admit" and "resumed_from" not in d.fields:
            if req.admit_time is not None and req.first_admit == req.admit_time:
                wait = d.t - req.submit_time
                out.append(functools.partial(self.metrics.observe_wait, req.tenant, req.kind, wait))
        elif d.event == "cull":
            out.append(functools.partial(self.metrics.inc_culled, req.tenant, req.kind))
        elif d.event == "preempt":
            out.append(functools.partial(self.metrics.inc_preempted, req.tenant, req.kind))
        if d.event in ("finish", "cancel", "preempt") and req.admit_time:
            flavor = req.assigned_flavor
            if flavor:
                out.append(functools.partial(self._held, flavor, max(0.0, d.t - req.admit_time)))
        return out

    def _held(self, flavor: str, seconds: float) -> None:
        times = self.hold_times.setdefault(flavor, [])
        times.append(seconds)
        del times[:-200]

    def _maybe_scale(self) -> None:
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

    # --- views ------------------------------------------------------------------------------

    def view(self, rid: str) -> dict[str, Any] | None:
        """The request object of `rid`: live from memory, else from the store."""
        live = self.requests.get(rid)
        if live is not None:
            return self.request_json(live)
        row = self.store.get(rid)
        return None if row is None else self.request_json(row)

    def request_json(self, req: Request | RequestRow) -> dict[str, Any]:
        """The API's request object, from a live request or a stored row."""
        if isinstance(req, Request):
            live: Request | None = req
            meta = self.meta.get(req.id, {})
            state = req.state.value
        else:
            live, meta, state = None, _meta_of(req), req.state
        out: dict[str, Any] = {
            "id": req.id,
            "user": req.user,
            "tenant": req.tenant,
            "kind": req.kind,
            "gpus": req.gpus,
            "flavor": req.flavor,
            "priority": req.priority,
            "name": meta.get("name"),
            "state": state,
            "created": meta.get("created"),
            "updated": meta.get("updated"),
            "submit_time": req.submit_time,
            "admitted_at": req.first_admit,
            "reason": req.reason or None,
            "position": None,
            "estimated_wait": None,
            "grant": None,
            "scaling": None,
        }
        if state == State.ADMITTED.value:
            devices = list(live.devices) if live else req.device_list()  # type: ignore[union-attr]
            out["grant"] = {
                "flavor": req.assigned_flavor,
                "node": req.node,
                "devices": devices,
                "uuids": self.inventory.uuids(req.node or "", devices),
                "lease_expires": req.lease_expires,
                "admitted_at": req.admit_time,
                "busy": req.busy,
                "utilization": meta.get("utilization"),
            }
        elif state == State.PARKED.value:
            out["parked"] = {"flavor": req.assigned_flavor, "expires": req.park_expires}
        out.update(self._preemption_of(req))
        if state == State.QUEUED.value and live is not None:
            # The index answers by bisection; the core's scan if it ever disagrees.
            pos = self.index.position(live) or self.core.position(live.id)
            if pos is not None:
                out["position"] = {
                    "tenant": pos.tenant_position,
                    "tenant_of": pos.tenant_queued,
                    "overall": pos.overall_position,
                    "of": pos.overall_queued,
                }
                wait, why = self._wait(live, pos.overall_position)
                out["estimated_wait"], out["waiting_for"] = wait, why
            out["scaling"] = self._scaling_for(live)
            reclaim = reclaim_wait(live, self.core.reclaiming(live.id), time.time())
            if reclaim is not None:  # a preemptor waiting out its victims' grace
                out["estimated_wait"] = reclaim
                out["waiting_for"] = {"kind": "quota", "message": f"waiting: {reclaim['basis']}"}
        return out

    def _preemption_of(self, req: Request | RequestRow) -> dict[str, Any]:
        """A warned victim's pending eviction: when, for whom, and why in words."""
        by = self.requests.get(req.preempted_by or "") if req.preempt_at is not None else None
        reason = preempt_reason(req.tenant, req.gpus, by.tenant if by is not None else None)
        return preemption_fields(req.preempt_at, req.preempted_by, reason)

    def _flavors_for(self, req: Request) -> list[str]:
        if req.flavor:
            return [req.flavor]
        tenant = self.config.tenants.get(req.tenant)
        return list(tenant.quota) if tenant else []

    def _scaling_for(self, req: Request) -> dict[str, Any] | None:
        """Nodes being provisioned for a flavor this request waits on, and when ready."""
        provisioning = self.core.provisioning()
        for flavor in self._flavors_for(req):
            coming = provisioning.get(flavor)
            if coming:
                return {"flavor": flavor, "nodes": len(coming), "ready_by": max(coming.values())}
        return None

    def estimate_wait(self, req: Request, position: int) -> dict[str, Any]:
        """A rough wait (`estimated_wait`): see waits.estimate."""
        return self._wait(req, position)[0]

    def _wait(self, req: Request, position: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(`estimated_wait`, `waiting_for`) of a queued request, in words (waits.py)."""
        flavors = waits.usable_flavors(self.config, req.tenant, self._flavors_for(req))
        return waits.estimate(
            req,
            position,
            now=time.time(),
            flavors=flavors,
            holders=self.index.admitted.values(),
            nodes=self.core.nodes(),
            hold_times=self.hold_times,
            idle_timeout=self._idle_timeout,
            config=self.config,
        )

    def _idle_timeout(self, tenant: str) -> float:
        t = self.config.tenants.get(tenant)
        if t is not None and t.idle_timeout is not None:
            return t.idle_timeout
        return self.config.policy.idle_timeout

    def devices_json(self) -> dict[str, Any]:
        out = self.inventory.to_json(self.samples)
        holders: dict[tuple[str, int], str] = {}
        for node in self.core.nodes():
            for index, rid in node.holders.items():
                holders[(node.name, index)] = rid
        for d in out["devices"]:
            holder = holders.get((d["node"], d["index"]))
            req = self.requests.get(holder) if holder else None
            d["holder"] = (
                {"id": req.id, "user": req.user, "tenant": req.tenant, "kind": req.kind}
                if req
                else None
            )
        out["nodes"] = [
            {
                "name": n.name,
                "flavor": n.flavor,
                "gpus": n.gpus,
                "autoscaled": n.autoscaled,
                "free": n.gpus - len(n.holders),
            }
            for n in self.core.nodes()
        ]
        out["desired_nodes"] = dict(self.core.desired_nodes())
        return out

    def tenants_json(self) -> dict[str, Any]:
        usage = waits.usage_json(self.config, self.core.tenant_usage())
        tenants = []
        for name, t in self.config.tenants.items():
            tenants.append(
                {
                    "name": name,
                    "cohort": t.cohort,
                    "quota": dict(t.quota),
                    "borrowing_limit": dict(t.borrowing_limit),
                    "lending_limit": dict(t.lending_limit),
                    "weight": t.weight,
                    "queueing": t.queueing,
                    "idle_timeout": self._idle_timeout(name),
                    "preemption_grace": grace_of(self.config, name),
                    "usage": usage.get(name, []),
                }
            )
        return {"simulated": self.inventory.simulated, "tenants": tenants}

    def snapshot_metrics(self) -> None:
        tenants = [
            TenantUsage(
                u.tenant, u.flavor, u.nominal, u.admitted, u.parked, u.borrowed, u.pending_gpus
            )
            for u in self.core.tenant_usage()
        ]
        pending: dict[tuple[str, str, str], int] = {}
        idle: dict[str, int] = {}
        holders: dict[tuple[str, int], tuple[str, str, str, tuple[int, ...]]] = {}
        for req in self.requests.values():
            if req.state is State.QUEUED:
                flavor = req.flavor or (self._flavors_for(req) or [""])[0]
                key = (req.tenant, flavor, req.kind)
                pending[key] = pending.get(key, 0) + 1
            elif req.state is State.ADMITTED:
                if not req.busy:
                    idle[req.tenant] = idle.get(req.tenant, 0) + req.gpus
                for index in req.devices:
                    holders[(req.node or "", index)] = (req.id, req.user, req.tenant, ())
        flavor_of = {(d.node, d.index): d.flavor for d in self.inventory.devices()}
        attributed = {key: (holder[1], holder[2]) for key, holder in holders.items()}
        rows = []
        for s in self.samples:
            user_tenant = attributed.get((s.node, s.index))
            rows.append(
                (
                    s,
                    flavor_of.get((s.node, s.index), ""),
                    user_tenant[1] if user_tenant else None,
                    user_tenant[0] if user_tenant else None,
                )
            )
        self.metrics.set_snapshot(
            tenants,
            [PendingCount(t, f, k, n) for (t, f, k), n in pending.items()],
            self.core.desired_nodes(),
            idle,
            rows,
            simulated=self.inventory.simulated,
            nodes=self._node_counts(),
            leader=self.leader,
        )

    def _node_counts(self) -> dict[str, int]:
        """Nodes per flavor in the core (every configured flavor, 0 included)."""
        counts = dict.fromkeys(self.config.flavors, 0)
        for node in self.core.nodes():
            counts[node.flavor] = counts.get(node.flavor, 0) + 1
        return counts


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


def _meta_of(row: RequestRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "created": row.created,
        "updated": row.updated,
        "utilization": row.utilization,
    }


__all__ = ["Arbiter", "Conflict", "SpecError", "new_request_id"]
