"""Kueue mode (`--admission kueue`): Kueue decides, the gateway records and shows it.

The engine of the arbiter (engine.py) when the cluster's Kueue is the one engine: the
gateway's own core decides nothing about requests. `follow()` lists Kueue's Workloads and
watches them (kubeapi/workloads.py), and each change becomes a request of ours and the
decision events of SCENARIO.md's table, committed through the arbiter's group commit like
every decision of the core (the store first; the HTTP answers, the event stream and the
metrics only once it committed):

    a new Workload                       -> a request (`submit`), queued
    QuotaReserved=True with an admission -> `admit` (the flavor Kueue assigned; the node
                                            once the job's pod is bound to one)
    back to pending (Evicted, Preempted) -> `preempt`, then `requeue` (Kueue requeues it)
    a pod of ours preempted               -> `preempt_warning` at the eviction, `preempt`
                                            once the pod is gone from the API server
    Finished=True, or deactivated        -> `finish` (`cancel` if it was never admitted)
    deleted                              -> `finish` (`cancel` if it was never admitted)

Every Workload counts, not only those of our holders: a Job made with kubectl that carries
`kueue.x-k8s.io/queue-name` shows in `api/requests` and on the admin page, its user from
the `gpuaas.jupyter.org/user` label or annotation, or "outside jupyter-gpuaas". A request's
tenant is its LocalQueue (`kueue manifests` names each tenant's LocalQueue and ClusterQueue
after it).

Positions come from Kueue's visibility API (the `pendingworkloads` of each ClusterQueue with
pending Workloads, asked again after every change and every `interval` seconds); where it
does not answer, the engine orders the pending Workloads of a queue itself as Kueue's
StrictFIFO does (priority, then creation time). `waiting_for` is Kueue's reason for not
reserving quota (the Workload's QuotaReserved=False condition), in our three kinds and in
words (workloads.waiting_words).

A queued request's wait estimate is the forward run of our core (gateway/estimates.py),
as with our core deciding, started from a core made from Kueue's state
(admission/from_kueue.py, `forward_core`): the quotas, the admitted Workloads as holders,
the pending ones in Kueue's order. It is made only when a set of estimates is, kept
until the next committed change like every set, or until the visibility API's
positions change (Kueue's order is the copy's).

Our holders (the Hub's QueuedKubeSpawner, the `gpuaas-kubernetes` kernel provisioner) go
through Kueue too, and keep their `Claim` (claim.py): a submission through the API is a
holder's *intent*, recorded as a queued request ("waiting for its pod to reach Kueue's
queue") whose id the holder puts on its pod as the `gpuaas.jupyter.org/request` label
beside the LocalQueue's. Kueue copies the label onto the pod's Workload
(`integrations.labelKeysToCopy`), and that Workload then drives the holder's request
(bound, not a request of its own): Kueue's admission is the holder's grant. An intent
whose pod never reaches Kueue (no Workload names it within `intent_timeout` seconds)
is cancelled, as a lease that expires.

A cancel or a release through the API ends the request at once (committed first), then
ends its job: a pod of Kueue's pod integration is deleted, any other job's Workload is
deactivated (`spec.active: false`; kubeapi/workloads.py `WorkloadWatch.stop`). A Workload
naming a request of ours that has ended is not shown again, and its job is ended too
(a holder whose request was cancelled before its pod reached Kueue leaves no gated pod).
A release of a request whose pod Kueue preempted (warned, the pod going, whether or
not Kueue has taken the quota back yet) ends it as preempted: the holder gives it back
because of the eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from jupyter_gpuaas.admission.core import AdmissionCore
from jupyter_gpuaas.admission.from_kueue import kueue_core_steps
from jupyter_gpuaas.admission.model import TERMINAL, Decision, Request, State
from jupyter_gpuaas.admission.views import Position

from ..kubeapi.workloads import (
    WorkloadChange,
    WorkloadView,
    WorkloadWatch,
    eviction_words,
    waiting_words,
)
from .estimates import kept_for
from .group_commit import Conflict
from .leader import NotLeader
from .rows import RowError

if TYPE_CHECKING:
    from .arbiter import Arbiter

log = logging.getLogger("jupyter_gpuaas.gateway.kueue")

#: Why a holder's request waits before Kueue has its pod.
NO_POD_YET = "waiting for its pod to reach Kueue's queue"


def request_id(uid: str) -> str:
    """The request id of a Workload: `r-` and the first 16 hex digits of its uid (the
    API's one id format; the same Workload is the same request after a restart)."""
    return "r-" + uid.replace("-", "")[:16]


def _over(req: Request) -> bool:
    """Has the request ended? Culled counts: Kueue mode parks nothing (docs/KUEUE.md)."""
    return req.state in TERMINAL or req.state is State.CULLED


def _pod_preempted(view: WorkloadView) -> bool:
    """Did Kueue preempt this Workload of a pod of its pod integration?"""
    return view.owner.startswith("Pod ") and view.evicted.startswith("Preempted")


class KueueEngine:
    """Kueue's decisions as the arbiter's engine (see the module docstring)."""

    def __init__(
        self, watch: WorkloadWatch, *, interval: float = 2.0, intent_timeout: float = 120.0
    ) -> None:
        self.watch = watch
        self.interval = interval
        self.intent_timeout = intent_timeout
        self.arbiter: Arbiter | None = None
        # The last Workload seen of each live request, by request id.
        self.views: dict[str, WorkloadView] = {}
        # Positions from the visibility API, by request id; None: it did not answer.
        self.positions: dict[str, Position] = {}
        self.visibility: str = "not asked yet"
        self._cluster_queues: dict[tuple[str, str], str] = {}
        self._poke = asyncio.Event()  # a change: the positions may be asked again
        self._poke_pods = asyncio.Event()  # a change: the pods may be looked at again
        self._stale = True  # memory may lag the Workloads: reconcile every one of them
        self._stops: set[asyncio.Task[None]] = set()  # jobs being ended (cancel, release)
        self._stopped: set[str] = set()  # uids of the Workloads whose job was ended
        self._cull_warned: set[str] = set()  # requests warned of their cull
        # Requests recorded as admitted, and those of them a holder's kernel or server
        # (ours to cull): what `admitted()` and `_idle()` walk instead of every request,
        # so that a submit's step costs no walk of thousands of queued ones. Kept loosely
        # (an id stays until a walk finds its request no longer admitted).
        self._admitted: set[str] = set()
        self._holders: set[str] = set()
        # Preempted pods on their way out, by request id (their Workload as last seen):
        # each request ends once its pod is gone from the API server (`_reap`).
        self._going: dict[str, WorkloadView] = {}
        # Seconds the last ask of the positions took (`_positions_loop`'s pacing).
        self._asked_cost = 0.0

    # --- the engine's face (engine.py): Kueue decides; a holder's intent waits for it --

    def submit(self, req: Request, now: float) -> list[Decision]:
        """A holder's intent: queued until the Workload of its pod drives it."""
        req.queue_time = now
        fields = {"tenant": req.tenant, "kind": req.kind, "gpus": req.gpus}
        return [Decision(now, "submit", req.id, fields)]

    def cancel(self, rid: str, now: float, reason: str = "") -> list[Decision]:
        return self._give_back(rid, now, reason)

    def finish(self, rid: str, now: float, reason: str = "") -> list[Decision]:
        return self._give_back(rid, now, reason)

    def _give_back(self, rid: str, now: float, reason: str) -> list[Decision]:
        """The request ends now (the arbiter commits it); its job is ended once that
        is committed: its pod deleted, or its Workload deactivated."""
        assert self.arbiter is not None
        req = self.arbiter.requests.get(rid)
        if req is None or _over(req):
            raise Conflict(f"request {rid} has ended")
        if rid in self._going or req.preempt_at is not None:
            # Kueue preempted its pod (the warning stands), which is on its way out: the
            # holder gives the grant back because of that eviction (it saw its pod go
            # before `_reap` did, or its user stopped early in the grace). It ends as what
            # it is, preempted, and Kueue is already deleting the pod. Whether Kueue has
            # taken the quota back yet (the Workload requeued: `_going`) or still holds it
            # while the pod terminates is a race the holder must not decide.
            decisions, _, _ = self._preempted(req, now, [])
            return decisions
        view = self.views.get(rid)
        decisions, _, _ = self._end(req, now, reason)
        if view is not None:
            self._stop_later(view)
        return decisions

    def _stop_later(self, view: WorkloadView) -> None:
        """End a Workload's job once what ended its request is committed (once per
        Workload: its later changes while it goes ask for nothing more)."""
        if view.uid in self._stopped:
            return
        self._stopped.add(view.uid)
        task = asyncio.get_running_loop().create_task(self._stop(view))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, view: WorkloadView) -> None:
        assert self.arbiter is not None
        try:
            await self.arbiter.settled()  # the end is in the store before the job goes
            await self.watch.stop(view)
        except Exception as e:
            log.warning("could not end %s in namespace %s: %s", view.owner, view.namespace, e)
            self._stopped.discard(view.uid)  # its next change tries again

    def heartbeat(self, rid: str, now: float, busy: bool | None = None) -> list[Decision]:
        """Kueue has no leases: a heartbeat records utilization, and whether the holder
        is busy, for our idle culling (`step`)."""
        req = self.arbiter.requests.get(rid) if self.arbiter is not None else None
        if req is None or busy is None:
            return []
        req.busy = busy
        if busy:
            req.idle_since = None
            self._cull_warned.discard(rid)
        elif req.idle_since is None:
            req.idle_since = now
        return []

    def restore(self, req: Request, now: float) -> list[Decision]:
        if req.state is State.ADMITTED:
            self._admitted.add(req.id)
        return []  # the stored request stays as it was until its Workload is seen again

    def step(self, now: float) -> list[Decision]:
        """Our idle culling on top of Kueue: a holder's kernel or server idle for its
        tenant's `idle_timeout` is culled (its pod deleted once that is committed, and
        Kueue finishes its Workload), warned `cull_warning` seconds before. Kueue keeps
        no reservation without a pod, so nothing is parked (docs/KUEUE.md)."""
        out: list[Decision] = []
        for req, cull_at, warn_at in self._idle():
            if now >= cull_at:
                view = self.views.get(req.id)
                req.state = State.CULLED
                req.culls += 1
                req.idle_since = None
                self._cull_warned.discard(req.id)
                out.append(Decision(now, "cull", req.id, {"parked": False}))
                self.views.pop(req.id, None)
                if view is not None:
                    self._stop_later(view)
            elif warn_at is not None and now >= warn_at and req.id not in self._cull_warned:
                self._cull_warned.add(req.id)
                out.append(Decision(now, "cull_warning", req.id, {"cull_at": cull_at}))
        return out

    def next_deadline(self) -> float | None:
        times = [
            t
            for req, cull_at, warn_at in self._idle()
            for t in (cull_at, warn_at if req.id not in self._cull_warned else None)
            if t is not None
        ]
        return min(times, default=None)

    def _idle(self) -> list[tuple[Request, float, float | None]]:
        """(request, cull time, warning time or None) of every idle holder we may cull:
        a kernel or server of ours (a Workload a holder's label bound), admitted."""
        arb = self.arbiter
        if arb is None:
            return []
        out = []
        policy = arb.config.policy
        for rid in list(self._holders):
            req, view = arb.requests.get(rid), self.views.get(rid)
            if req is None or view is None or req.state is not State.ADMITTED:
                self._holders.discard(rid)
                continue
            if req.idle_since is None:
                continue
            if not view.request or req.kind == "job" or req.preempt_at is not None:
                continue
            tenant = arb.config.tenants.get(req.tenant)
            own = tenant.idle_timeout if tenant is not None else None
            timeout = float(policy.idle_timeout if own is None else own)
            if timeout <= 0:
                continue
            cull_at = req.idle_since + timeout
            lead = policy.cull_warning
            out.append((req, cull_at, cull_at - lead if 0 < lead < timeout else None))
        return out

    def reclaiming(self, rid: str) -> list[Request]:
        return []

    def admitted(self) -> Iterable[Request]:
        arb = self.arbiter
        if arb is None:
            return []
        out = []
        for rid in list(self._admitted):
            req = arb.requests.get(rid)
            if req is None or req.state is not State.ADMITTED:
                self._admitted.discard(rid)
            else:
                out.append(req)
        return out

    def position(self, rid: str) -> Position | None:
        pos = self.positions.get(rid)
        if pos is not None:
            return pos
        return self._ordered_position(rid)

    def waiting_for(self, rid: str) -> tuple[str, dict[str, Any]] | None:
        view = self.views.get(rid)
        if view is None:
            req = self.arbiter.requests.get(rid) if self.arbiter is not None else None
            if req is None or req.state is not State.QUEUED:
                return None
            return "fifo", {"sentence": NO_POD_YET, "gpus": req.gpus, "tenant": req.tenant}
        if view.state != "queued":
            return None
        if not (view.reason or view.message):
            kind, sentence = "fifo", "Kueue has not looked at it yet"
        else:
            kind, sentence = waiting_words(view.queue, view.reason, view.message)
        return kind, {"sentence": sentence, "gpus": view.gpus, "tenant": view.queue}

    def forward_core(self, now: float) -> Generator[None, None, AdmissionCore]:
        """The steps that make a core in Kueue's state as of `now`, where the forward-run
        wait estimates start (admission/from_kueue.py): the quotas, the requests of the
        admitted Workloads (those of our holders' kernels and servers culled when idle),
        the pending ones' in Kueue's order, and their positions from the visibility API.
        Asked only when a set of estimates is made (gateway/estimates.py), never per view
        or per submit; its inputs are read at its first step."""
        arb = self.arbiter
        assert arb is not None
        pending = [
            req
            for rid, view in self.views.items()
            if view.state == "queued"
            and (req := arb.requests.get(rid)) is not None
            and req.state is State.QUEUED
        ]
        positions = {rid: pos.overall_position for rid, pos in self.positions.items()}
        return kueue_core_steps(
            arb.config,
            self.admitted(),
            pending,
            now,
            positions=positions,
            cullable=self._holders,
        )

    def _rid_of(self, view: WorkloadView) -> str | None:
        """The request a Workload drives: the holder's that its pod names (None once that
        one has ended: its pod is on its way out), else a request of its own."""
        if view.request:
            arb = self.arbiter
            req = arb.requests.get(view.request) if arb is not None else None
            return view.request if req is not None and not _over(req) else None
        return request_id(view.uid)

    def _overdue(self, now: float) -> bool:
        """Is an intent waiting for its pod longer than `intent_timeout`?"""
        arb = self.arbiter
        return arb is not None and any(
            r.state is State.QUEUED
            and rid not in self.views
            and now - r.submit_time > self.intent_timeout
            for rid, r in arb.requests.items()
        )

    def _ordered_position(self, rid: str) -> Position | None:
        """Where the visibility API does not answer: the queue ordered as StrictFIFO."""
        arb, view = self.arbiter, self.views.get(rid)
        if arb is None or view is None or view.state != "queued":
            return None
        same = [
            v
            for r, v in self.views.items()
            if v.queue == view.queue
            and v.state == "queued"
            and (req := arb.requests.get(r)) is not None
            and req.state is State.QUEUED
        ]
        same.sort(key=lambda v: (-v.priority, v.created, v.uid))
        at = next(i for i, v in enumerate(same) if v.uid == view.uid) + 1
        return Position(at, len(same), at, len(same))

    # --- following Kueue -------------------------------------------------------------

    def start(self, arbiter: Arbiter) -> list[asyncio.Task[None]]:
        self.arbiter = arbiter
        loop = asyncio.get_running_loop()
        return [
            loop.create_task(self.follow()),
            loop.create_task(self._positions_loop()),
            loop.create_task(self._pods_loop()),
        ]

    async def follow(self) -> None:
        """List the Workloads, then follow every change, for as long as the gateway runs."""
        try:
            while True:
                try:
                    await self.watch.list_workloads()
                    break
                except Exception as e:
                    log.error("cannot list Kueue's Workloads (%s); trying again", e)
                    await asyncio.sleep(self.interval)
            await self._reconcile()
            async for change in self.watch.changes():
                if self._stale:
                    await self._reconcile()
                else:
                    await self._apply([change])
                self._poke.set()
                self._poke_pods.set()
        finally:
            await self.watch.close()

    async def _apply(self, changes: Sequence[WorkloadChange], everything: bool = False) -> None:
        """Record changes through the arbiter's group commit; a failure (the store, a
        standby) leaves memory stale, and the next change or tick reconciles."""
        assert self.arbiter is not None
        try:
            await self.arbiter.run(functools.partial(self._record, changes, everything))
        except NotLeader:
            self._stale = True
        except RowError as e:  # this Workload's row cannot be stored: it fails alone
            log.warning("a Workload the store cannot hold is left out: %s", e)
        except Exception as e:
            log.warning("Kueue's Workloads not recorded yet (%s): will reconcile", e)
            self._stale = True

    async def _reconcile(self) -> None:
        """Every Workload as last seen, and the end of requests whose Workload is gone:
        one operation each, queued together (one group, one transaction), so that one
        the store refuses fails alone."""
        self._stale = False
        await asyncio.gather(
            *[self._apply([WorkloadChange(v)]) for v in list(self.watch.seen.values())],
            self._apply([], everything=True),
        )

    async def _positions_loop(self) -> None:
        """Ask the positions again after every change and every `interval` seconds,
        paced by the estimates' rule (estimates.py `kept_for`): an ask that took c seconds
        is not made again within 10 c (30 s at most), so that with thousands of pending
        Workloads (an answer of up to 1,000 per ClusterQueue) the asks take at most about
        a tenth of the event loop that answers the holders' submits, and of the API
        server. c is the ask's wall time (its answers' waits included: the API server's
        share too)."""
        while True:
            start = time.perf_counter()
            try:
                if self._stale and self.arbiter is not None and self.arbiter.leader:
                    await self._reconcile()
                await self._refresh_positions()
                if self._overdue(time.time()):
                    await self._apply([], everything=True)
            except Exception as e:
                log.warning("positions from Kueue's visibility API failed: %s", e)
            done = time.perf_counter()
            self._asked_cost = done - start
            self._poke.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.interval)
            rest = kept_for(self._asked_cost) - (time.perf_counter() - done)
            if rest > 0:
                await asyncio.sleep(rest)

    async def _refresh_positions(self) -> None:
        """Each ClusterQueue with pending Workloads of ours asked once; one walk of the
        views, then one of each answer (never the views once per queue)."""
        by_name: dict[tuple[str, str], tuple[str, tuple[str, str]]] = {}
        in_local: dict[tuple[str, str], int] = {}  # queued in each (namespace, LocalQueue)
        for rid, v in self.views.items():
            if v.state == "queued":
                local = (v.namespace, v.queue)
                in_local[local] = in_local.get(local, 0) + 1
                by_name[(v.namespace, v.name)] = (rid, local)
        positions: dict[str, Position] = {}
        said = "answers"
        asked: set[str] = set()
        for ns, lq in sorted(in_local):
            try:
                cq = await self._cluster_queue(ns, lq)
                if cq in asked:
                    continue
                asked.add(cq)
                pending = await self.watch.pending_positions(cq)
            except Exception as e:
                said = f"does not answer ({e})"
                continue
            for key, (in_cq, in_lq, of) in pending.items():
                mine = by_name.get(key)
                if mine is not None:
                    rid, local = mine
                    positions[rid] = Position(in_lq, max(in_local[local], in_lq), in_cq, of)
        if said != self.visibility:
            log.info("Kueue's visibility API %s", said)
        self.visibility = said
        moved = positions != self.positions
        self.positions = positions
        if self.arbiter is not None:
            self.arbiter._json_cache = {}
            if moved:  # Kueue's order changed: the estimates' copy followed the old one
                self.arbiter.estimates.forget()

    async def _cluster_queue(self, namespace: str, local_queue: str) -> str:
        key = (namespace, local_queue)
        if key not in self._cluster_queues:
            from kubernetes_asyncio import client

            api = client.CustomObjectsApi(await self.watch.client())
            lq = await api.get_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", namespace, "localqueues", local_queue
            )
            self._cluster_queues[key] = str(lq["spec"]["clusterQueue"])
        return self._cluster_queues[key]

    async def bind_nodes(self) -> None:
        """The node of each admitted request whose job's pod is bound now."""
        missing: dict[str, dict[str, str]] = {}
        for req in self.admitted():  # the admitted only, not every Workload seen
            view = self.views.get(req.id)
            if view is not None and req.node is None:
                missing.setdefault(view.namespace, {})[view.owner_uid] = req.id
        found: list[tuple[str, str]] = []
        for ns, owners in missing.items():
            for owner, node in (await self.watch.bound_nodes(ns, set(owners))).items():
                found.append((owners[owner], node))
        if found and self.arbiter is not None:
            await self.arbiter.run(functools.partial(self._record_nodes, found))

    async def _pods_loop(self) -> None:
        """The pods of the grants, after every change and every `interval` seconds, not
        paced with the positions (a few reads, each of a pod that matters now): the node
        of each new grant, and the end of each preempted pod's request once it is gone."""
        while True:
            try:
                await self.bind_nodes()
                await self._reap()
            except Exception as e:
                log.warning("the pods of Kueue's admitted Workloads not read: %s", e)
            self._poke_pods.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poke_pods.wait(), self.interval)

    async def _reap(self) -> None:
        """End the requests whose preempted pod is gone from the API server."""
        if not self._going or self.arbiter is None:
            return
        gone = []
        for rid, view in list(self._going.items()):
            try:
                here = await self.watch.pod_exists(view.namespace, view.owner, view.owner_uid)
            except Exception as e:  # asked again at the next round
                log.warning("cannot tell whether %s is gone: %s", view.owner, e)
                continue
            if not here:
                gone.append(rid)
        if gone:
            await self.arbiter.run(functools.partial(self._record_gone, gone))

    # --- on the arbiter's loop, inside its group commit ------------------------------

    def _record_gone(self, rids: Sequence[str]) -> None:
        assert self.arbiter is not None
        now = time.time()
        for rid in rids:
            self._going.pop(rid, None)
            req = self.arbiter.requests.get(rid)
            if req is not None and req.state is State.ADMITTED and req.preempt_at is not None:
                self.arbiter.commit(*self._preempted(req, now, []))

    def _record_nodes(self, found: Sequence[tuple[str, str]]) -> None:
        assert self.arbiter is not None
        now = time.time()
        touched = []
        for rid, node in found:
            req = self.arbiter.requests.get(rid)
            if req is not None and req.state is State.ADMITTED and req.node is None:
                req.node = node
                touched.append(req)
        self.arbiter.commit([], now, extra=touched)

    def _record(self, changes: Sequence[WorkloadChange], everything: bool) -> None:
        arb = self.arbiter
        assert arb is not None
        now = time.time()
        for change in changes:
            if change.gone:
                self._stopped.discard(change.view.uid)
            rid = self._rid_of(change.view)
            if rid is not None:
                arb.commit(*self._decide(rid, change, now))
            elif not change.gone and change.view.state != "finished" and not change.view.evicted:
                self._stop_later(change.view)  # its request has ended: so does its job
        if everything:  # a request of a Workload that is no more: it ended meanwhile
            seen = {self._rid_of(v) for v in self.watch.seen.values()}
            for rid, req in list(arb.requests.items()):
                if rid in seen or _over(req) or rid in self._going:
                    continue  # (a preempted pod on its way out: `_reap` ends it)
                had = rid in self.views or req.first_admit is not None
                if had and req.preempt_at is not None:  # warned, and its pod's Workload gone
                    arb.commit(*self._preempted(req, now, []))
                    continue
                if had or now - req.submit_time > self.intent_timeout:
                    # Its Workload seen (or admitted: an intent is admitted only once
                    # bound) and gone; or a holder's intent whose pod never came (a
                    # restored queued request of a Workload gone meanwhile ends so too).
                    why = (
                        "its Workload was deleted"
                        if had
                        else "its pod did not reach Kueue's queue within "
                        f"{self.intent_timeout:.0f} s"
                    )
                    arb.commit(*self._end(req, now, why, gone=True))

    def _decide(
        self, rid: str, change: WorkloadChange, now: float
    ) -> tuple[list[Decision], float, list[Request]]:
        arb = self.arbiter
        assert arb is not None
        view = change.view
        req = arb.requests.get(rid)
        out: list[Decision] = []
        if req is not None and req.state is State.PREEMPTED and _pod_preempted(view):
            return [], now, []  # its pod, preempted, is on its way out
        if req is not None and req.state is State.CULLED:
            return [], now, []  # culled: its pod is on its way out (no parking here)
        if req is None or req.state in TERMINAL:
            if change.gone or view.state == "finished":
                return [], now, []  # ended before this gateway saw it, or already recorded
            req = Request(
                id=rid,
                tenant=view.queue,
                user=view.user,
                kind=view.kind,
                gpus=view.gpus,
                submit_time=view.created or now,
                priority=view.priority,
                queue_time=view.created or now,
            )
            arb.requests[rid] = req
            # The store's name column holds 255 characters; a pod's name may take 253.
            name = f"{view.owner} ({view.namespace})"[:255]
            arb.meta[rid] = {"name": name, "created": now}
            fields = {"tenant": req.tenant, "kind": req.kind, "gpus": req.gpus}
            out.append(Decision(now, "submit", rid, fields))
        self.views[rid] = view
        if req.preempt_at is not None and (change.gone or view.state != "admitted"):
            # Kueue took the quota back (or its Workload went): the request ends once the
            # pod is gone, which its grace (and the preStop hook) may hold a while yet.
            return self._going_out(req, view, now, out)
        if change.gone:
            return self._end(req, now, f"its {view.owner} was deleted", gone=True, out=out)
        if view.state == "finished":
            return self._end(req, now, view.finished or "finished", out=out)
        if view.state == "admitted" and req.state is not State.ADMITTED:
            req.state = State.ADMITTED
            req.assigned_flavor = view.flavor
            req.admit_time = now
            req.held_since = now  # Kueue parks nothing: every admission begins a hold
            if req.first_admit is None:
                req.first_admit = now
            req.reason = ""
            # A holder is idle from its admission until it says it is busy (as the core
            # has it), so that one that never works is culled too.
            req.idle_since = None if req.busy else now
            fields = {
                "tenant": req.tenant,
                "flavor": view.flavor,
                "gpus": req.gpus,
                "node": req.node,
                "devices": [],
                "by": "kueue",
            }
            out.append(Decision(now, "admit", rid, fields))
        elif (
            view.state == "admitted"
            and _pod_preempted(view)
            and req.state is State.ADMITTED
            and req.preempt_at is None
        ):
            # Kueue preempted a pod of its pod integration (a kernel's, a server's): it
            # deletes the pod, which keeps running through its termination grace, and
            # holds the quota until the pod stops. The user is warned now, with the time.
            req.preempt_at = (view.evicted_at or now) + view.grace
            req.preempted_by = self._preemptor(view)
            fields = {"by": req.preempted_by, "at": req.preempt_at}
            out.append(Decision(now, "preempt_warning", rid, fields))
        elif view.state == "queued" and req.state is State.ADMITTED and _pod_preempted(view):
            # Seen only once Kueue took the quota back (a stalled gateway, a slow watch):
            # warned now all the same, and it ends once the pod is gone.
            req.preempt_at = (view.evicted_at or now) + view.grace
            req.preempted_by = self._preemptor(view)
            fields = {"by": req.preempted_by, "at": req.preempt_at}
            out.append(Decision(now, "preempt_warning", rid, fields))
            return self._going_out(req, view, now, out)
        elif view.state == "queued" and req.state is State.ADMITTED:
            # Kueue took the quota back (Evicted: Preempted, a lost node, ...) and
            # requeued the Workload: the job starts again once admitted again.
            req.preemptions += 1
            why = eviction_words(view.queue, view.evicted)
            out.append(Decision(now, "preempt", rid, {"by": "kueue", "reason": why}))
            req.state = State.QUEUED
            req.assigned_flavor = None
            req.node = None
            req.admit_time = None
            req.reason = why
            out.append(Decision(now, "requeue", rid))
        if req.state is State.ADMITTED:
            self._admitted.add(rid)
            if view.request and req.kind != "job":
                self._holders.add(rid)
        return out, now, [req]

    def _preemptor(self, view: WorkloadView) -> str | None:
        """The request of the Workload Kueue preempted `view` for, when it is one of ours
        (a Workload in a namespace we watch)."""
        by = self.watch.seen.get(view.preemptor) if view.preemptor else None
        return self._rid_of(by) if by is not None else None

    def _going_out(
        self, req: Request, view: WorkloadView, now: float, out: list[Decision]
    ) -> tuple[list[Decision], float, list[Request]]:
        """A preempted pod is on its way out: its request stays admitted, warned, until
        `_reap` sees the pod gone (a job of another kind ends now: it has no pod here)."""
        if not view.owner.startswith("Pod "):
            return self._preempted(req, now, out)
        self._going[req.id] = view
        self._poke_pods.set()
        return out, now, [req]

    def _preempted(
        self, req: Request, now: float, out: list[Decision]
    ) -> tuple[list[Decision], float, list[Request]]:
        """A pod Kueue preempted is gone: its request ends as preempted (Kueue's pod
        integration does not requeue a pod it deleted; nobody makes it again). The
        arbiter words the reason from `by` (words.preempted_reason)."""
        self._going.pop(req.id, None)
        req.state = State.PREEMPTED
        req.preemptions += 1
        by = req.preempted_by or "kueue"
        req.preempt_at = None
        out.append(Decision(now, "preempt", req.id, {"by": by}))
        self.views.pop(req.id, None)
        self.positions.pop(req.id, None)
        return out, now, [req]

    def _end(
        self,
        req: Request,
        now: float,
        why: str,
        *,
        gone: bool = False,
        out: list[Decision] | None = None,
    ) -> tuple[list[Decision], float, list[Request]]:
        out = out if out is not None else []
        admitted = req.state is State.ADMITTED or req.first_admit is not None
        req.state = State.FINISHED if admitted else State.CANCELLED
        req.reason = why
        out.append(Decision(now, "finish" if admitted else "cancel", req.id, {"reason": why}))
        self.views.pop(req.id, None)
        self.positions.pop(req.id, None)
        return out, now, [req]
