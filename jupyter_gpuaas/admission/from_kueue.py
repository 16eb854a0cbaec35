"""A core made from Kueue's state: where a forward-run wait estimate starts in Kueue mode.

In Kueue mode (`gateway --admission kueue`, gateway/kueue_engine.py) Kueue decides, and
the gateway's own core holds no requests. A queued request's wait estimate is still the
forward run of our core (estimate.py), started from a core made here from what Kueue
says, as a restart rebuilds the core from the store (`AdmissionCore.restore`):

- the quotas: the gateway's config, the quota file the Kueue objects were made from
  (`kueue manifests`), with Kueue's timing and without what Kueue does not do:
  `one_head_per_cycle` on (Kueue's scheduler admits one head per ClusterQueue a cycle),
  no parking (Kueue keeps no reservation without a pod: a culled holder's quota goes back
  at once), no leases, no autoscaling;
- the room: Kueue reserves quota, not devices (without Topology-Aware Scheduling it looks
  at no node), so each flavor is one node as wide as all its quota (the tenants' nominal
  quotas and the cohorts' own), or as what is admitted on it where that is more: only the
  quotas decide who goes in, as in Kueue;
- the admitted Workloads as holders: the flavor of their admission, their admission time,
  their kind and user (the history predicts how long each is held), idle since when only
  for those the gateway culls (`cullable`: a holder's kernel or server); a victim that
  Kueue preempted for a Workload in the queue (its pod in its termination grace) is
  evicted at its time for that one, and one preempted for a Workload we do not see keeps
  its quota (as that Workload will) until the history says;
- the pending Workloads as queued requests, each ClusterQueue's in Kueue's order: by
  priority, then by the visibility API's position where it gave one (those it has not
  placed yet behind them, by creation time).

Every Workload counts, ours and those made outside jupyter-gpuaas; those of a LocalQueue
or flavor the config does not know are left out (nothing says what quota they take).

Pure: a function of plain inputs (the config, the requests, the positions, the time); the
requests are read before the first step and copied, never changed. In steps, as
estimate.py's copies are (it yields every `STEP` requests restored).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Generator, Iterable, Mapping

from .core import AdmissionCore
from .estimate import STEP
from .model import Config, Flavor, Request, State


def kueue_config(config: Config, admitted: Iterable[Request] = ()) -> Config:
    """The config of a core that decides as Kueue does: Kueue's cycles, no parking, no
    leases, no autoscaling, and each flavor one node wide enough for all its quota (or for
    the `admitted` requests' GPUs on it, where that is more)."""
    room = _room(config, admitted)
    flavors = {name: Flavor(name, 0, max(1, room[name])) for name in config.flavors}
    tenants = {
        name: dataclasses.replace(t, reservation_ttl=0.0) for name, t in config.tenants.items()
    }
    policy = dataclasses.replace(
        config.policy,
        one_head_per_cycle=True,
        reservation_ttl=0.0,
        lease_ttl=0.0,
        autoscale={},
        take_over_parked=False,
    )
    return Config(flavors, tenants, policy, config.cohorts)


def _room(config: Config, admitted: Iterable[Request]) -> dict[str, int]:
    """GPUs of each flavor: all the quota of it, or what is admitted on it if more."""
    quota = dict.fromkeys(config.flavors, 0)
    owned = [t.quota for t in config.tenants.values()] + [c.quota for c in config.cohorts.values()]
    for of in owned:
        for flavor, n in of.items():
            if flavor in quota:
                quota[flavor] += n
    used = dict.fromkeys(config.flavors, 0)
    for req in admitted:
        if req.assigned_flavor in used:
            used[req.assigned_flavor] += req.gpus
    return {f: max(quota[f], used[f]) for f in quota}


def node_name(flavor: str) -> str:
    """The one node of a flavor in a core made from Kueue's state."""
    return f"{flavor} (Kueue's quota)"


def kueue_order(pending: Iterable[Request], positions: Mapping[str, int]) -> list[Request]:
    """The pending requests in Kueue's order: by ClusterQueue (tenant), priority, then
    the visibility API's position where known (the others behind, by creation time)."""

    def key(req: Request) -> tuple[str, int, bool, int, float, str]:
        at = positions.get(req.id)
        return (req.tenant, -req.priority, at is None, at or 0, req.queue_time, req.id)

    return sorted(pending, key=key)


def kueue_core_steps(
    config: Config,
    admitted: Iterable[Request],
    pending: Iterable[Request],
    now: float,
    *,
    positions: Mapping[str, int] | None = None,
    cullable: Collection[str] = (),
) -> Generator[None, None, AdmissionCore]:
    """A core in Kueue's state (see the module docstring): `admitted`, the requests of the
    admitted Workloads; `pending`, those of the pending ones; `positions`, each pending
    one's position in its ClusterQueue from the visibility API, where known; `cullable`,
    the ids of the holders the gateway culls when idle. Yields every `STEP` requests."""
    tenants, flavors = config.tenants, config.flavors
    holders = [r for r in admitted if r.tenant in tenants and (r.assigned_flavor or "") in flavors]
    queued = [
        r for r in pending if r.tenant in tenants and (r.flavor is None or r.flavor in flavors)
    ]
    ordered = kueue_order(queued, positions or {})
    waiting = {r.id for r in ordered}
    copies: list[Request] = []
    seq = 0
    used = dict.fromkeys(flavors, 0)
    for r in sorted(holders, key=_admitted_order):
        seq += 1
        flavor = r.assigned_flavor or ""
        first = used[flavor]
        used[flavor] += r.gpus
        ours = r.id in cullable
        # A victim in its grace goes at its time for its preemptor, if that one waits here.
        warned = r.preempt_at is not None and r.preempted_by in waiting
        copies.append(
            Request(r.id, r.tenant, r.user, r.kind, r.gpus, r.submit_time,
                    priority=r.priority, busy=r.busy if ours else False,
                    state=State.ADMITTED, queue_time=r.queue_time, seq=seq,
                    assigned_flavor=flavor, node=node_name(flavor),
                    devices=tuple(range(first, first + r.gpus)),
                    first_admit=r.first_admit,
                    admit_time=now if r.admit_time is None else r.admit_time,
                    idle_since=r.idle_since if ours else None,
                    preemptions=r.preemptions, culls=r.culls,
                    preempt_at=r.preempt_at if warned else None,
                    preempted_by=r.preempted_by if warned else None,
                    held_since=r.held_since)
        )  # fmt: skip
    # Queue order within a ClusterQueue and a priority is (queue time, arrival): both
    # follow Kueue's order (a queue time is never earlier than the one before it).
    last: dict[tuple[str, int], float] = {}
    for r in ordered:
        seq += 1
        level = (r.tenant, r.priority)
        queue_time = max(r.queue_time, last.get(level, r.queue_time))
        last[level] = queue_time
        copies.append(
            Request(r.id, r.tenant, r.user, r.kind, r.gpus, r.submit_time,
                    flavor=r.flavor, priority=r.priority, busy=r.busy,
                    queue_time=queue_time, seq=seq, preemptions=r.preemptions,
                    culls=r.culls)
        )  # fmt: skip
    core = AdmissionCore(kueue_config(config, holders))
    for flavor, width in _room(config, holders).items():
        if width > 0:
            core.add_node(flavor, node_name(flavor), width, now)
    for i, req in enumerate(copies):
        if i % STEP == STEP - 1:
            yield
        core.restore(req, now)
    return core


def kueue_core(
    config: Config,
    admitted: Iterable[Request],
    pending: Iterable[Request],
    now: float,
    *,
    positions: Mapping[str, int] | None = None,
    cullable: Collection[str] = (),
) -> AdmissionCore:
    """`kueue_core_steps`, at once."""
    steps = kueue_core_steps(config, admitted, pending, now, positions=positions, cullable=cullable)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            core: AdmissionCore = done.value
            return core


def _admitted_order(req: Request) -> tuple[float, str]:
    return (req.admit_time or 0.0, req.id)


__all__ = ["kueue_config", "kueue_core", "kueue_core_steps", "kueue_order", "node_name"]
