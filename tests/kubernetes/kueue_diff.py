"""The machinery of the differential test (test_kueue_differential.py): one scenario run
through our admission core (the simulator) and through the REAL Kueue controller of the
session cluster, and what each admitted and evicted.

A `Case` is a quota file and its requests in waves. Every request of a wave is submitted at
once: in the core at the wave's instant (0, then `WAVE_GAP`), in Kueue as suspended
`batch/v1` Jobs created one per second (Kueue orders a queue by priority, then creation
time, and a creation timestamp has whole seconds: distinct seconds make Kueue's order the
scenario's order, which is the core's arrival order), held back from admission by a gate
until the whole wave exists, then released at once. The gate: the ClusterQueues select
namespaces by a label that the wave's namespace gets only when all its Workloads exist
(until then Kueue marks them "workload namespace doesn't match ClusterQueue selector";
the label's change requeues them all in one step per cohort tree).

Nothing finishes: the core's durations are long, and KWOK completes a Job's pod only after
its `pod-complete.stage.kwok.x-k8s.io/delay` (a day here). Nodes do not bind: each flavor
gets one KWOK node (and the core one node) with room for every request of the case, so
Kueue's quota and the core's quota decide alone.

All cases run on the cluster side by side (every name carries the case's key: flavors,
cohorts, ClusterQueues, namespaces), so the waits are paid once, not per case.
"""

from __future__ import annotations

import calendar
import copy
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas.admission.config import CONFIG_KEYS, parse_config
from jupyter_gpuaas.kubeapi.meta import cluster_flavors
from jupyter_gpuaas.kubernetes.kueue import manifests
from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.scenario import parse_scenario

#: When the core sees the second wave (the first is at 0); any instant after the first's.
WAVE_GAP = 10.0
#: Long enough that nothing ends while the waves are compared.
DURATION = 10**6
#: The namespace label the ClusterQueues select: a wave's namespace gets it once its
#: Workloads all exist (the gate).
OPEN = "gpuaas.jupyter.org/diff-open"
CASE = "gpuaas.jupyter.org/diff-case"
GATE_MESSAGE = "namespace doesn't match"
PREEMPTING = "Pending the preemption"
#: How long the Workloads must stay unchanged before the run counts as settled.
QUIET = 3.0
RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": RESOURCE, "value": "present", "effect": "NoSchedule"}


@dataclass
class Case:
    """A quota file (`quota`: CONFIG_KEYS only) and its requests in waves (each request a
    scenario request dict: id, tenant, gpus, priority, flavor)."""

    name: str
    quota: dict[str, Any]
    waves: list[list[dict[str, Any]]]
    key: str = ""

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [r for wave in self.waves for r in wave]


@dataclass
class Outcome:
    """What one engine did in each wave: the admitted requests with their flavor, and the
    requests evicted by a preemption during the wave."""

    admitted: list[dict[str, str]] = field(default_factory=list)
    preempted: list[set[str]] = field(default_factory=list)
    #: Kueue's word for each request still pending after the last wave (not compared:
    #: what a failure shows).
    pending: dict[str, str] = field(default_factory=dict)
    #: The requests the core rejected at submit (Kueue rejects none: they stay pending).
    rejected: set[str] = field(default_factory=set)


# ---------------------------------------------------------------------------------------
# Making cases


def fit_for_kueue(name: str, data: Mapping[str, Any], *, split: float | None = None,
                  limit: int = 12) -> Case | None:  # fmt: skip
    """The case of a scenario (a shipped one, or one drawn as the property tests draw
    them), kept to what both engines model (docs/KUEUE.md): no fair sharing (the cluster's
    Kueue runs without it), no idle culling, parking, grace or autoscale, jobs only; a
    tenant Kueue refuses (`borrow_within_cohort` without `reclaim_within_cohort`) reclaims
    LowerPriority; requests naming an unknown tenant or flavor are left out. Requests go in
    submit order; with `split`, those submitted at or after it form the second wave.
    None when no request is left."""
    quota = {k: copy.deepcopy(v) for k, v in data.items() if k in CONFIG_KEYS}
    quota.pop("policy", None)
    for tenant in quota["tenants"].values():
        for key in ("idle_timeout", "reservation_ttl", "preemption_grace"):
            tenant.pop(key, None)
        pre = tenant.get("preemption")
        if (
            pre
            and pre.get("reclaim_within_cohort", "Never") == "Never"
            and pre.get("borrow_within_cohort", "Never") != "Never"
        ):
            pre["reclaim_within_cohort"] = "LowerPriority"
    flavors = set(quota["flavors"])
    raw = sorted(enumerate(data.get("requests") or []), key=lambda p: (p[1].get("submit", 0), p[0]))
    waves: list[list[dict[str, Any]]] = [[], []]
    for _, r in raw:
        if (
            r["tenant"] not in quota["tenants"]
            or r.get("flavor", next(iter(flavors))) not in flavors
        ):
            continue
        req = {"id": str(r["id"]), "tenant": r["tenant"], "gpus": int(r["gpus"])}
        req["priority"] = int(r.get("priority", 0))
        if "flavor" in r:
            req["flavor"] = r["flavor"]
        second = split is not None and r.get("submit", 0) >= split
        waves[1 if second else 0].append(req)
        if sum(map(len, waves)) >= limit:
            break
    if not waves[0] and not waves[1]:
        return None
    return Case(name, quota, [w for w in waves if w])


def may_keep_room(case: Case) -> bool:
    """Can docs/KUEUE.md's known difference "a head that fits its nominal quota but cannot
    preempt keeps its room" show in `case`? Kueue holds such a head's room for the rest of
    the scheduling cycle unless its ClusterQueue reclaims `Any`
    (`reserveCapacityForUnreclaimablePreempt`, `preemption.CanAlwaysReclaim`), and only a
    StrictFIFO head is looked at again every cycle; without a cohort no other queue could
    have taken that room. So: a StrictFIFO tenant in a cohort that does not reclaim Any.
    A BestEffortFIFO head is looked at again too, whenever Kueue requeues its cohort's
    inadmissible workloads (the second wave's gate does, found by a fresh draw, seed
    374306118): so also a request of such a tenant that the core leaves waiting at the end
    of a wave though it would fit its tenant's nominal quota."""
    tenants = case.quota["tenants"]

    def unreclaimable(t: Mapping[str, Any]) -> bool:
        pre = t.get("preemption") or {}
        return bool(t.get("cohort")) and pre.get("reclaim_within_cohort", "Never") != "Any"

    if any(t.get("queueing") == "StrictFIFO" and unreclaimable(t) for t in tenants.values()):
        return True
    core = run_core(case)
    submitted: list[dict[str, Any]] = []
    for wave, admitted in zip(case.waves, core.admitted, strict=True):
        submitted += wave
        held: dict[tuple[str, str], int] = {}
        for r in submitted:
            if r["id"] in admitted:
                key = (r["tenant"], admitted[r["id"]])
                held[key] = held.get(key, 0) + r["gpus"]
        for r in submitted:
            t = tenants[r["tenant"]]
            if r["id"] in admitted or r["id"] in core.rejected or not unreclaimable(t):
                continue
            flavors = [r["flavor"]] if "flavor" in r else list(t["quota"])
            if any(
                held.get((r["tenant"], f), 0) + r["gpus"] <= t["quota"].get(f, 0) for f in flavors
            ):
                return True
    return False


def may_pick_otherwise(case: Case) -> bool:
    """Can docs/KUEUE.md's known difference "Kueue picks among tied victims by UID" change
    more than which of the tied requests goes? Kueue orders victims of one tenant, priority
    and second of quota reservation (as a wave's requests are) by UID, at random from run
    to run (`CandidatesOrdering`), where the core takes the most recently admitted; the
    test takes the tied ones as interchangeable (test_kueue_differential.interchangeable).
    That holds while they are alike: a tied request of another size or flavor frees other
    room (and may change the flavor the preemptor takes: the borrowing height once its
    victims are gone), and under `within_tenant: LowerOrNewerEqualPriority` an older victim,
    requeued, takes its room back from a newer one of its tenant (found by a fresh draw,
    seed 800306200). So: a preemption in the core whose victim had a tie, of another size
    or flavor, or of a tenant that preempts LowerOrNewerEqualPriority."""
    run = run_scenario(parse_scenario(core_scenario(case), name=case.name))
    shape = {r["id"]: r for r in case.requests}
    held: dict[str, tuple[int, str]] = {}  # admitted now: id -> (wave admitted, flavor)
    for d in run.decisions:
        e = d.to_json()
        if e["event"] == "admit":
            held[e["id"]] = (int(e["t"] // WAVE_GAP), e["flavor"])
        elif e["event"] in ("preempt", "finish", "cancel"):
            gone = held.pop(e["id"], None)
            if e["event"] != "preempt" or gone is None:
                continue
            v = shape[e["id"]]
            pre = case.quota["tenants"][v["tenant"]].get("preemption") or {}
            chains = pre.get("within_tenant") == "LowerOrNewerEqualPriority"
            for rid, (wave, flavor) in held.items():
                u = shape[rid]
                if (u["tenant"], u["priority"], wave) != (v["tenant"], v["priority"], gone[0]):
                    continue
                if chains or (u["gpus"], flavor) != (v["gpus"], gone[1]):
                    return True
    return False


def without_never_fitting(case: Case) -> Case:
    """`case` without the requests the core rejects at submit as never fitting, where
    docs/KUEUE.md's known difference "a request that can never fit is rejected" would show:
    Kueue keeps such a request pending, and it then blocks a StrictFIFO queue, and takes a
    BestEffortFIFO queue's turn of a cycle each time Kueue looks at it. Both engines leave
    it unadmitted either way; without it, the rest compares."""
    rejected = run_core(case).rejected
    if not rejected:
        return case
    waves = [[r for r in wave if r["id"] not in rejected] for wave in case.waves]
    return Case(case.name, case.quota, [w for w in waves if w], case.key)


def keyed(case: Case, key: str) -> Case:
    """`case` with every cluster-wide name (flavor, tenant, cohort) prefixed by `key`, so
    cases run side by side on one cluster and beside other tests' Kueue objects."""

    def n(name: str) -> str:
        return f"{key}-{name}".lower().replace("_", "-")

    def per_flavor(block: Mapping[str, Any] | None) -> dict[str, Any]:
        return {n(f): v for f, v in (block or {}).items()}

    q = copy.deepcopy(case.quota)
    out: dict[str, Any] = {"flavors": per_flavor(q["flavors"]), "tenants": {}}
    for tname, t in q["tenants"].items():
        for k in ("quota", "borrowing_limit", "lending_limit"):
            if k in t:
                t[k] = per_flavor(t[k])
        if "cohort" in t:
            t["cohort"] = n(t["cohort"])
        out["tenants"][n(tname)] = t
    if q.get("cohorts"):
        out["cohorts"] = {}
        for cname, c in q["cohorts"].items():
            for k in ("quota", "borrowing_limit", "lending_limit"):
                if k in c:
                    c[k] = per_flavor(c[k])
            if c.get("parent"):
                c["parent"] = n(c["parent"])
            out["cohorts"][n(cname)] = c
    if "policy" in q:
        out["policy"] = q["policy"]
        if "autoscale" in q["policy"]:
            out["policy"]["autoscale"] = per_flavor(q["policy"]["autoscale"])
    waves = []
    for wave in case.waves:
        renamed = []
        for r in wave:
            r = dict(r, tenant=n(r["tenant"]))
            if "flavor" in r:
                r["flavor"] = n(r["flavor"])
            renamed.append(r)
        waves.append(renamed)
    return Case(case.name, out, waves, key)


# ---------------------------------------------------------------------------------------
# The core


def core_scenario(case: Case) -> dict[str, Any]:
    """The case as a scenario: each wave submitted at one instant in request order, every
    flavor one node with room for all of the case's GPUs (nodes never bind), and the core
    admitting one head per tenant per cycle, as Kueue does (docs/KUEUE.md "Known
    differences": "A burst is shared out in turns")."""
    room = max(1, sum(r["gpus"] for r in case.requests))
    data: dict[str, Any] = copy.deepcopy(case.quota)
    data["flavors"] = {f: {"nodes": 1, "gpus_per_node": room} for f in data["flavors"]}
    data["policy"] = {"one_head_per_cycle": True}
    data["requests"] = [
        {**r, "user": "u", "kind": "job", "submit": i * WAVE_GAP, "duration": DURATION}
        for i, wave in enumerate(case.waves)
        for r in wave
    ]
    data["until"] = len(case.waves) * WAVE_GAP
    return data


def run_core(case: Case) -> Outcome:
    """What our core decided: the state just after each wave's instant."""
    run = run_scenario(parse_scenario(core_scenario(case), name=case.name))
    events = [d.to_json() for d in run.decisions]
    out = Outcome()
    admitted: dict[str, str] = {}
    for i in range(len(case.waves)):
        start, end = i * WAVE_GAP, (i + 1) * WAVE_GAP
        preempted: set[str] = set()
        for e in events:
            if not start <= e["t"] < end:
                continue
            if e["event"] == "admit":
                admitted[e["id"]] = e["flavor"]
            elif e["event"] == "reject":
                out.rejected.add(e["id"])
            elif e["event"] in ("preempt", "finish", "cancel"):
                admitted.pop(e["id"], None)
                if e["event"] == "preempt":
                    preempted.add(e["id"])
        out.admitted.append(dict(admitted))
        out.preempted.append(preempted)
    return out


# ---------------------------------------------------------------------------------------
# The real Kueue


def namespace(case: Case, wave: int) -> str:
    return f"gd-{case.key}-w{wave}"


def priority_class(value: int) -> str:
    return f"gpuaas-diff-p{value}" if value >= 0 else f"gpuaas-diff-m{-value}"


def kueue_objects(case: Case) -> list[dict[str, Any]]:
    """`kueue manifests` of the case's quota for each wave's namespace, the ClusterQueues
    selecting the case's namespaces only once they are open (the gate)."""
    config = parse_config(case.quota)
    flavors = cluster_flavors(config, {}, {})
    docs: list[dict[str, Any]] = []
    for wave in range(len(case.waves)):
        made = manifests(config, flavors, namespace(case, wave))
        docs += made if wave == 0 else [d for d in made if d["kind"] == "LocalQueue"]
    for d in docs:
        if d["kind"] == "ClusterQueue":
            d["spec"]["namespaceSelector"] = {"matchLabels": {CASE: case.key, OPEN: "yes"}}
    return docs


def support_objects(case: Case, kwok_node: Any) -> list[dict[str, Any]]:
    """The case's namespaces (closed) and a KWOK node per flavor with room for every
    request of the case (the flavor's node label and GPU taint)."""
    from jupyter_gpuaas.kubeapi.meta import FLAVOR_LABEL

    room = str(max(1, sum(r["gpus"] for r in case.requests)))
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace(case, w), "labels": {CASE: case.key}},
        }
        for w in range(len(case.waves))
    ]
    for f in case.quota["flavors"]:
        out.append(kwok_node(f"gd-{f}", {FLAVOR_LABEL: f}, {RESOURCE: room}, [GPU_TAINT]))
    return out


def job(case: Case, wave: int, index: int, req: Mapping[str, Any]) -> dict[str, Any]:
    """A suspended Job for the request: its tenant's LocalQueue, a WorkloadPriorityClass
    for its priority, one pod asking its GPUs, pinned by node selector to its flavor if it
    names one; KWOK keeps the pod running for a day."""
    from jupyter_gpuaas.kubeapi.meta import FLAVOR_LABEL

    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {RESOURCE: str(req["gpus"])}},
            }
        ],
    }
    if "flavor" in req:
        pod["nodeSelector"] = {FLAVOR_LABEL: req["flavor"]}
    day = "86400s"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"q{index}",
            "namespace": namespace(case, wave),
            "labels": {
                "kueue.x-k8s.io/queue-name": req["tenant"],
                "kueue.x-k8s.io/priority-class": priority_class(req["priority"]),
            },
            "annotations": {"gpuaas.jupyter.org/request": req["id"]},
        },
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "annotations": {
                        "pod-complete.stage.kwok.x-k8s.io/delay": day,
                        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": day,
                    }
                },
                "spec": pod,
            },
        },
    }


def _condition(wl: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def _preemptions(wl: Mapping[str, Any]) -> int:
    stats = (wl.get("status") or {}).get("schedulingStats") or {}
    return sum(
        e.get("count", 0) for e in stats.get("evictions") or [] if e["reason"] == "Preempted"
    )


@dataclass
class _Wl:
    case: str
    wave: int
    index: int
    queue: str
    priority: int
    created: str
    reserved: bool
    message: str
    evicted: bool
    preemptions: int
    flavor: str

    @property
    def gated(self) -> bool:
        return not self.reserved and (not self.message or GATE_MESSAGE in self.message)


class KueueRun:
    """Every case through the real Kueue of `cluster` (scripts/cluster.py's Cluster) at
    once; `outcome(case)` afterwards."""

    def __init__(self, cluster: Any, cases: Sequence[Case], kwok_node: Any) -> None:
        self.cluster = cluster
        self.cases = {c.key: c for c in cases}
        self.kwok_node = kwok_node
        self.outcomes: dict[str, Outcome] = {c.key: Outcome() for c in cases}

    # -- kubectl

    def _apply(self, docs: Iterable[dict[str, Any]]) -> None:
        self.cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-",
            # JSON, not YAML: a request named Y or N would read as a boolean to Go's YAML.
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}),
        )  # fmt: skip

    def workloads(self) -> list[_Wl]:
        listed = json.loads(
            self.cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-A", "-o", "json")
        )["items"]
        out = []
        for wl in listed:
            ns: str = wl["metadata"]["namespace"]
            if not ns.startswith("gd-"):
                continue
            key, _, wave = ns[3:].rpartition("-w")
            owner = next(iter(wl["metadata"].get("ownerReferences") or []), None)
            if key not in self.cases or owner is None:
                continue
            reserved = _condition(wl, "QuotaReserved") or {}
            evicted = _condition(wl, "Evicted") or {}
            admission = (wl.get("status") or {}).get("admission") or {}
            flavors = [
                fl
                for ps in admission.get("podSetAssignments") or []
                for fl in (ps.get("flavors") or {}).values()
            ]
            out.append(
                _Wl(
                    case=key,
                    wave=int(wave),
                    index=int(owner["name"][1:]),
                    queue=wl["spec"].get("queueName", ""),
                    priority=int(wl["spec"].get("priority") or 0),
                    created=wl["metadata"]["creationTimestamp"],
                    reserved=reserved.get("status") == "True",
                    message=reserved.get("message", ""),
                    evicted=evicted.get("status") == "True",
                    preemptions=_preemptions(wl),
                    flavor=flavors[0] if flavors else "",
                )
            )
        return out

    # -- the run

    def setup(self) -> None:
        priorities = sorted({r["priority"] for c in self.cases.values() for r in c.requests})
        docs: list[dict[str, Any]] = [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": priority_class(p)},
                "value": p,
            }
            for p in priorities
        ]
        for case in self.cases.values():
            docs += support_objects(case, self.kwok_node)
        self._apply(docs)
        self._apply(d for c in self.cases.values() for d in kueue_objects(c))

    def run_wave(self, wave: int, timeout: float = 120.0) -> None:
        """Create the wave's Jobs (request i of every case in second i), open the gate once
        every Workload exists, wait until Kueue has settled, and record the outcome."""
        cases = [c for c in self.cases.values() if len(c.waves) > wave]
        if not cases:
            return
        before = {(w.case, w.wave, w.index): w.preemptions for w in self.workloads()}
        longest = max(len(c.waves[wave]) for c in cases)
        for i in range(longest):
            batch = [(c, i) for c in cases if i < len(c.waves[wave])]
            self._apply(job(c, wave, i, c.waves[wave][i]) for c, i in batch)
            want = {(c.key, i) for c, i in batch}
            made = _wait(
                lambda want=want: _made(self.workloads(), wave, want),
                timeout,
                f"the Workloads of batch {i}",
            )
            # The next batch in a later second: distinct creation timestamps, in order.
            last = max(
                calendar.timegm(time.strptime(w.created, "%Y-%m-%dT%H:%M:%SZ")) for w in made
            )
            _sleep_past(last + 1)
        self.cluster.kubectl(
            "label", "namespace", *(namespace(c, wave) for c in cases), f"{OPEN}=yes"
        )
        final = self._settle(cases, wave, timeout)
        for c in cases:
            mine = [w for w in final if w.case == c.key]
            ids = {(w.wave, w.index): c.waves[w.wave][w.index]["id"] for w in mine}
            outcome = self.outcomes[c.key]
            outcome.admitted.append({ids[w.wave, w.index]: w.flavor for w in mine if w.reserved})
            outcome.pending = {ids[w.wave, w.index]: w.message for w in mine if not w.reserved}
            outcome.preempted.append(
                {
                    ids[w.wave, w.index]
                    for w in mine
                    if w.preemptions > before.get((w.case, w.wave, w.index), 0)
                }
            )

    def _settle(self, cases: Sequence[Case], wave: int, timeout: float) -> list[_Wl]:
        """Wait until Kueue is done with the wave: no preemption under way, Kueue has
        looked at every queue of the wave since a gate opened (one of its Workloads is
        admitted or pending for a reason of its own: Kueue leaves some Workloads unlooked
        at, behind a StrictFIFO head or beside an equivalent one that did not fit, so not
        every one is), and nothing changed over QUIET seconds."""
        keys = {c.key for c in cases}
        last: list[Any] = []
        since = [0.0]
        waiting: list[str] = []

        def settled() -> list[_Wl] | None:
            wls = [w for w in self.workloads() if w.case in keys]
            busy = [w for w in wls if (w.evicted and w.reserved) or PREEMPTING in w.message]
            queues = {(w.case, w.queue) for w in wls if w.wave == wave}
            seen = {(w.case, w.queue) for w in wls if not w.gated}
            waiting[:] = [f"{w.case} wave {w.wave} request {w.index}: {w.message!r}" for w in busy]
            waiting.extend(f"{c} queue {q}: not looked at" for c, q in sorted(queues - seen))
            state = sorted((w.case, w.wave, w.index, w.reserved, w.flavor, w.preemptions,
                            w.message) for w in wls)  # fmt: skip
            now = time.monotonic()
            if waiting or state != last:
                last[:] = state
                since[0] = now
                return None
            return wls if now - since[0] >= QUIET else None

        return _wait(
            settled, timeout, "Kueue to settle", interval=0.5,
            detail=lambda: "still under way:\n" + "\n".join(waiting),
        )  # fmt: skip

    def teardown(self) -> None:
        names = [namespace(c, w) for c in self.cases.values() for w in range(len(c.waves))]
        self.cluster.kubectl("delete", "namespace", *names, "--wait=false", check=False)
        for kind in ("clusterqueues", "cohorts", "resourceflavors"):
            objs = [
                d["metadata"]["name"]
                for c in self.cases.values()
                for d in kueue_objects(c)
                if d["kind"].lower() + "s" == kind
            ]
            if objs:
                self.cluster.kubectl(
                    "delete", f"{kind}.kueue.x-k8s.io", *objs, "--wait=false", check=False
                )
        nodes = [f"gd-{f}" for c in self.cases.values() for f in c.quota["flavors"]]
        self.cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)


def _made(wls: Sequence[_Wl], wave: int, want: set[tuple[str, int]]) -> list[_Wl] | None:
    got = [w for w in wls if w.wave == wave and (w.case, w.index) in want]
    return got if len(got) == len(want) else None


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.2,
          detail: Any = None) -> Any:  # fmt: skip
    from helpers import wait_for

    return wait_for(predicate, timeout, what, interval=interval, detail=detail)


def _sleep_past(instant: float) -> None:
    """Wait for the clock to pass `instant` (a creation timestamp's next second)."""
    left = instant - time.time()
    if left > 0:
        time.sleep(left + 0.02)
