"""The gateway's reading of the core's state for people: who lends to whom, and waits.

The core decides and counts; this turns its counts into what a request object and the
tenant list say: the cohort members a borrower's GPUs come from, the estimated wait of a
queued request and why it waits (`waiting_for`), all in the sentences of
jupyter_gpuaas/words.py. Functions of plain inputs (the arbiter passes its state and the
time in), so each case is tested without a gateway.

A request's wait sentence is read by its owner, who may lack the view scope: another
user's grant is "another user of <tenant>", never their name (the view rule of
api/devices). The object is the same for whoever reads it (its SSE event is encoded once).
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from jupyter_gpuaas.admission.model import Config, Request, State
from jupyter_gpuaas.admission.views import NodeState, TenantUsage
from jupyter_gpuaas.words import Release, plural, reason_sentence, usage_sentence, wait_sentence


def _root(config: Config, cohort: str | None) -> str | None:
    """The root of a cohort's tree (itself for a flat cohort); None without a cohort."""
    seen: set[str] = set()
    while cohort is not None and cohort not in seen:
        seen.add(cohort)
        spec = config.cohorts.get(cohort)
        if spec is None or spec.parent is None:
            return cohort
        cohort = spec.parent
    return cohort


def lenders(config: Config, usage: Sequence[TenantUsage]) -> dict[tuple[str, str], list[str]]:
    """Per borrowing (tenant, flavor): the cohort members whose unused quota covers it.

    In a cohort tree, every tenant of the same tree is a member (its GPUs may be lent up
    and down the tree); the cohorts' own quota is nobody's to name.

    The ledger pools what members lend, so no GPU is tied to one lender; a borrower is said
    to borrow from the members with the most unused lendable quota, as many as it takes to
    cover what it borrowed (all of them when even that is not enough).
    """
    held = {(u.tenant, u.flavor): u.admitted + u.parked for u in usage}
    out: dict[tuple[str, str], list[str]] = {}
    for u in usage:
        if u.borrowed <= 0:
            continue
        spec = config.tenants.get(u.tenant)
        if spec is None or spec.cohort is None:
            continue
        root = _root(config, spec.cohort)
        spare: list[tuple[int, str]] = []
        for name, other in config.tenants.items():
            if name == u.tenant or u.flavor not in other.quota:
                continue
            if other.cohort is None or _root(config, other.cohort) != root:
                continue
            unused = other.quota[u.flavor] - held.get((name, u.flavor), 0)
            free = min(other.lendable(u.flavor), unused)
            if free > 0:
                spare.append((-free, name))
        names: list[str] = []
        covered = 0
        for neg, name in sorted(spare):
            names.append(name)
            covered -= neg
            if covered >= u.borrowed:
                break
        out[(u.tenant, u.flavor)] = sorted(names)
    return out


def usage_json(config: Config, usage: Sequence[TenantUsage]) -> dict[str, list[dict[str, Any]]]:
    """api/tenants' usage lists, by tenant: the counts, the lenders and the sentence."""
    lent = lenders(config, usage)
    out: dict[str, list[dict[str, Any]]] = {}
    for u in usage:
        names = lent.get((u.tenant, u.flavor), [])
        out.setdefault(u.tenant, []).append(
            {
                "flavor": u.flavor,
                "quota": u.nominal,
                "admitted": u.admitted,
                "parked": u.parked,
                "borrowed": u.borrowed,
                "borrowed_from": names,
                "pending_gpus": u.pending_gpus,
                "pending_requests": u.pending_requests,
                "message": usage_sentence(
                    u.tenant,
                    u.flavor,
                    used=u.admitted + u.parked,
                    quota=u.nominal,
                    lenders=names,
                    parked=u.parked,
                ),
            }
        )
    return out


#: (when, GPUs, idle?, holder): plain tuples, because a view walks every holder.
_End = tuple[float, int, bool, Request]


class _Holds:
    """Past hold times of a flavor, sorted with suffix sums: how much longer, on average,
    past grants held longer than `age` were held, in O(log n) per holder."""

    def __init__(self, times: Sequence[float]) -> None:
        self.times = sorted(times)
        self.suffix = [0.0] * (len(self.times) + 1)
        for i in range(len(self.times) - 1, -1, -1):
            self.suffix[i] = self.suffix[i + 1] + self.times[i]

    def left_after(self, age: float) -> float | None:
        i = bisect.bisect_right(self.times, age)
        longer = len(self.times) - i
        return None if longer == 0 else self.suffix[i] / longer - age


def estimate(
    req: Request,
    position: int,
    *,
    now: float,
    flavors: Sequence[str],
    holders: Iterable[Request],
    nodes: Iterable[NodeState],
    hold_times: Mapping[str, Sequence[float]],
    idle_timeout: Callable[[str], float],
    config: Config | None = None,
    reason: tuple[str, Mapping[str, Any]] | None = None,
    eta: str = "",
    eta_seconds: float | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`estimated_wait`, `waiting_for`) of a queued request at `position` overall.

    Counts one GPU per request ahead (their sizes are not looked up for a display). The
    estimate is when enough of the grants in use will have ended: idle ones when culled,
    others after as long as past grants of the flavor were held. `seconds` is None with
    its reason when no grant in use has a known end. With `config`, a request that devices
    are free for but nothing is ahead of (its quota holds it back) says its tenant's usage,
    counted from the same holders (not a scan of every queue, for every queued request).
    With `reason` (the core's `waiting_for`: what nomination found), its kind is the kind
    and its sentence the message, followed by the estimate; the guess from this view's
    counts is only the fallback of a core that has not looked at the request yet.
    With `eta` (the forward run's estimate in words, estimates.py, of `eta_seconds`), the
    sentence ends with it instead of the next release guessed here (or with that release
    when it is an idle grant's cull that the forward run found its turn at).
    """
    total = free = widest = 0
    for node in nodes:
        if node.flavor in flavors:
            total += node.gpus
            free += node.gpus - len(node.holders)
            widest = max(widest, node.gpus - len(node.holders))
    in_use = 0
    ends: list[_End] = []
    mine: list[Request] = []
    holds = {f: _Holds(hold_times.get(f, ())) for f in flavors}
    timeouts: dict[str, float] = {}
    for h in holders:  # inlined: a view walks every holder, for every queued request
        flavor = h.assigned_flavor
        if h.state is not State.ADMITTED or flavor is None or flavor not in holds:
            continue
        in_use += h.gpus
        mine.append(h)
        timeout = timeouts.get(h.tenant)
        if timeout is None:
            timeout = timeouts[h.tenant] = idle_timeout(h.tenant)
        if h.kind != "job" and h.idle_since is not None and timeout > 0:
            ends.append((max(now, h.idle_since + timeout), h.gpus, True, h))  # culled then
        elif h.admit_time is not None:
            # Past grants held longer than this one has been: on average, how much longer.
            # None held this long: its end is unknown (never "0 s", never overdue).
            left = holds[flavor].left_after(now - h.admit_time)
            if left is not None:
                ends.append((now + left, h.gpus, False, h))
    ends.sort(key=operator.itemgetter(0))
    ahead = max(0, position - 1)
    label = flavors[0] if len(flavors) == 1 else "GPUs"
    need = max(1, req.gpus + ahead - free)
    seconds: float | None = None
    got = 0
    for at, gpus, _, _ in ends:
        got += gpus
        if got >= need:
            seconds = at - now
            break
    if seconds is None and ends:
        samples = [t for f in flavors for t in hold_times.get(f, ())]
        if samples:  # then grants come and go about as long as they did
            rounds = math.ceil((need - got) / max(1, in_use))
            seconds = ends[-1][0] - now + rounds * sum(samples) / len(samples)
    release = None
    if ends:
        at, _, idle_end, first = ends[0]
        # Another user's grant by tenant only: the owner of `req` reads this sentence, and
        # names follow the view rule (api/devices shows them only with custom:gpuaas:view).
        whose = first.user if first.user == req.user else None
        release = Release(whose, first.kind, at - now, idle=idle_end, tenant=first.tenant)
    if seconds is None:
        why = f"no estimate yet: none of the {label} in use has a known end"
        wait: dict[str, Any] = {"seconds": None, "basis": why}
    else:
        idle = sum(1 for e in ends if e[2])
        basis = f"when enough of the {plural(in_use, label, label)} in use are free: "
        parts = []
        if idle:
            parts.append(f"{plural(idle, 'grant')} idle until culled")
        if len(ends) > idle:
            parts.append(f"{plural(len(ends) - idle, 'grant')} held about as long as past ones")
        wait = {"seconds": round(max(1.0, seconds)), "basis": basis + " and ".join(parts)}
    turn = wait["seconds"] if not eta else eta_seconds
    if reason is not None:
        why = reason_sentence(reason[0], reason[1])
        if reason[0] == "capacity" and free < req.gpus and not reason[1].get("coming"):
            # The same fact in the counts a person sees ("all 4 a100 are in use"); the
            # core's sentence when it says more (fragmented free GPUs, nodes coming).
            why = ""
        if reason[0] == "quota":  # "waiting for quota: vision uses all 2 of its a100; ..."
            message = wait_sentence(flavor=label, total=total, free=max(free, req.gpus),
                                    gpus=req.gpus, release=release, turn=turn,
                                    quota=why, eta=eta)  # fmt: skip
        else:
            message = wait_sentence(flavor=label, total=total, free=free, gpus=req.gpus,
                                    release=release, turn=turn, why=why,
                                    eta=eta)  # fmt: skip
        return wait, {"kind": reason[0], "message": message}
    if widest >= req.gpus:  # one node has room: the queue or the quota holds it back
        kind = "fifo" if ahead else "quota"
    else:
        kind = "capacity"
    quota_text = ""
    if kind == "quota" and config is not None:
        held: dict[tuple[str, str], int] = {}
        for h in mine:
            key = (h.tenant, h.assigned_flavor or "")
            held[key] = held.get(key, 0) + h.gpus
        quota_text = _quota_text(config, req.tenant, flavors, held)
    message = wait_sentence(
        flavor=label,
        total=total,
        free=free if kind == "capacity" else max(free, req.gpus),
        gpus=req.gpus,
        ahead=ahead,
        release=release,
        turn=turn,
        quota=quota_text,
        eta=eta,
    )
    return wait, {"kind": kind, "message": message}


def _quota_text(
    config: Config, tenant: str, flavors: Sequence[str], held: Mapping[tuple[str, str], int]
) -> str:
    """The tenant's usage sentences of `flavors`, from what its cohort holds."""
    rows = []
    for name, t in config.tenants.items():
        for f in flavors:
            if f in t.quota:
                used = held.get((name, f), 0)
                rows.append(TenantUsage(name, f, t.quota[f], used, 0, max(0, used - t.quota[f]),
                                        0, 0))  # fmt: skip
    usage = usage_json(config, rows).get(tenant, [])
    return "; ".join(u["message"] for u in usage)


def usable_flavors(config: Config, tenant: str, flavors: Sequence[str]) -> list[str]:
    """The flavors a tenant could ever get GPUs of: quota of its own, or a cohort member's
    to borrow. A `t4: 0` of a tenant alone says nothing about its wait for an a100."""
    spec = config.tenants.get(tenant)
    if spec is None:
        return list(flavors)
    out = []
    for f in flavors:
        root = _root(config, spec.cohort)
        if spec.quota.get(f, 0) > 0 or (
            root is not None
            and (
                any(
                    _root(config, t.cohort) == root and t.name != tenant and t.lendable(f) > 0
                    for t in config.tenants.values()
                )
                or any(
                    c.quota.get(f, 0) > 0 and _root(config, c.name) == root
                    for c in config.cohorts.values()
                )
            )
        ):
            out.append(f)
    return out or list(flavors)
