"""Kueue's scheduler baseline, scaled down, through the REAL Kueue and through our core,
side by side on one machine (issue 42 item 6).

The workload is `kueue_baseline.build()`'s: Kueue's own generator shapes
(`test/performance/scheduler/configs/baseline/generator.yaml`: per tenant small 1 GPU
0.2 s priority 50 one every 0.1 s, medium 5 GPUs 0.5 s priority 100 every 0.5 s, large
20 GPUs 1 s priority 200 every 1.2 s; nominal 20, borrowing limit 100, reclaim Any,
within LowerPriority), by default with fewer cohorts, tenants and requests (`--cohorts`,
`--tenants`, `--scale`: 2 x 3 x 0.1), since a 2-core machine running a whole control
plane cannot take 15,000 Jobs in minutes; with `--workloads` (below) it takes the whole
baseline (`--cohorts 5 --tenants 6 --scale 1`).

Engines (each a column):
- `kueue`: the real Kueue v0.19.2 on the local control plane (scripts/cluster.py; a
  running one with `--cluster-dir`, else one started and stopped here). `kueue
  manifests` of the quota file applied; one suspended `batch/v1` Job per request created
  at its submit time (from the start of the run) in its tenant's LocalQueue, with a
  WorkloadPriorityClass for its priority; KWOK nodes with room for the whole quota run
  the pods, and KWOK completes each pod after its runtime
  (`pod-complete.stage.kwok.x-k8s.io/delay`). Time to admission: from the Job's creation
  to the moment the watch sees its Workload's QuotaReserved condition (the client's
  clock: the condition's own timestamps have whole seconds).
- `core`: `jupyter-gpuaas simulate` on the same scenario: the simulated clock gives the
  makespan and the waits, the process's wall time what it cost.
- `kueue_mode`: our gateway in Kueue mode (`jupyter-gpuaas gateway --admission kueue`,
  a process of its own, SQLite store) on the same cluster, fed as our holders feed it: per
  request, at its submit time, the holder's intent (`POST api/requests` through
  `GatewayClient`), then the same suspended Job labelled with the tenant's LocalQueue and
  the request's id (`kueue_labels`, as the holders label their pods): Kueue copies the
  label onto the Workload and the gateway binds that Workload to the intent. Time to
  admission: from the submit to the gateway's `admit` event for the request on its event
  stream (what a holder waits for); finished: its `finish` event. Also reported: the
  gateway's own store at the end (requests that reached `admitted`, and `finished`, read
  back through the API), the gateway process's CPU seconds, and how far its `admit` and
  `finish` events lag behind Kueue's own conditions (a watch of the Workloads, as the
  `kueue` column's).

`--workloads` (Kueue's own method; the command of the full baseline): in both Kueue
columns each request is a `kueue.x-k8s.io/v1beta2` Workload created directly in its
tenant's LocalQueue (one podSet of one pod asking for its GPUs, its WorkloadPriorityClass,
and in kueue_mode the same `kueue_labels` with the request's id, on the Workload itself),
with no Job and no pod; this process plays the part of Kueue's baseline runner
(test/performance/scheduler/runner/controller): it marks each Admitted Workload Finished
after its runtime, and gives up an evicted one's quota reservation (what a job controller
would do), on a watch that resumes from its resourceVersion and lists again on 410 Gone.
Time to admission: from the Workload's creation to the watch seeing QuotaReserved (kueue)
or to the gateway's `admit` event (kueue_mode). Without it, suspended Jobs as above.

Reported per engine: makespan (first submit to last finish) against the quota-bound floor
(max of the last submit plus its runtime, and the GPU-seconds over the quota), time to
admission p50/p95 per class, and lost workloads (never finished by the deadline).

The Kueue columns run one after the other on one cluster (each in a namespace and with
ClusterQueues of its own), so they do not compete for the control plane.

    .venv/bin/python benchmarks/kueue_side_by_side.py [--cohorts 2] [--tenants 3]
        [--scale 0.1] [--cluster-dir .cluster] [--only kueue,kueue_mode,core] [--json]
        [--workloads] [--at-once 16] [--deadline 300]

The full baseline (15,000 workloads), as recorded in benchmarks/RESULTS.md:

    kueue_side_by_side.py --cohorts 5 --tenants 6 --scale 1 --workloads --at-once 64 \
        --deadline 1200 --cluster-dir .cluster --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import _bench
import kueue_baseline
import yaml

REPO = Path(__file__).resolve().parent.parent
RESOURCE = "nvidia.com/gpu"
FLAVOR = "gpu"
#: The Workload API that Kueue v0.19.2 stores (it serves v1beta1 too) and its runner uses.
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
#: Where a Workload carries its runtime, in ms (as Kueue's runner labels its Workloads).
RUNTIME_LABEL = "gpuaas.jupyter.org/runtime-ms"
#: Creations (and, in kueue_mode, submits) in flight at once; `--at-once` sets it.
AT_ONCE = 16


def scenario(cohorts: int, tenants: int, scale: float) -> dict[str, Any]:
    return kueue_baseline.build(cohorts=cohorts, tenants_per_cohort=tenants, scale=scale)


def floor(data: dict[str, Any]) -> float:
    """The quota-bound floor of the makespan: no engine ends before the last request's
    submit plus its runtime, nor before the quota has served every GPU-second."""
    quota = sum(t["quota"][FLAVOR] for t in data["tenants"].values())
    work = sum(r["gpus"] * r["duration"] for r in data["requests"])
    last = max(r["submit"] + r["duration"] for r in data["requests"])
    return round(max(last, work / quota), 3)


def summarize(waits: dict[str, list[float]], makespan: float, lost: int, wall: float,
              data: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    return {
        "makespan_s": round(makespan, 3),
        "floor_s": floor(data),
        "over_floor": round(makespan / floor(data), 2),
        "wall_s": round(wall, 3),
        "lost": lost,
        "classes": {
            cls: {
                "admitted": len(w),
                "wait_p50": round(_bench.percentile(w, 50), 3) if w else None,
                "wait_p95": round(_bench.percentile(w, 95), 3) if w else None,
            }
            for cls, w in waits.items()
        },
    }


# ---------------------------------------------------------------------------------------
# Our core


def run_core(data: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "baseline.json"
        path.write_text(json.dumps(data))
        timing, result = _bench.time_simulate(path, repeat=1)
    waits: dict[str, list[float]] = {cls: [] for cls, *_ in kueue_baseline.CLASSES}
    lost = 0
    for rid, r in result["requests"].items():
        if r["admitted_at"] is not None:
            waits[kueue_baseline.class_of(rid)].append(r["wait"])
        if r["state"] != "finished":
            lost += 1
    return summarize(waits, result["summary"]["end"], lost, timing.best, data)


# ---------------------------------------------------------------------------------------
# The real Kueue


def _cluster_module() -> Any:
    spec = importlib.util.spec_from_file_location("gpuaas_cluster", REPO / "scripts" / "cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuaas_cluster"] = module
    spec.loader.exec_module(module)
    return module


def _objects(data: dict[str, Any], ns: str, kwok_node: Callable[..., Any]) -> list[dict[str, Any]]:
    from jupyter_gpuaas.admission.config import parse_config
    from jupyter_gpuaas.kubeapi.meta import FLAVOR_LABEL, cluster_flavors
    from jupyter_gpuaas.kubernetes.kueue import manifests

    config = parse_config({k: data[k] for k in ("flavors", "tenants")})
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    ]
    quota = sum(t["quota"][FLAVOR] for t in data["tenants"].values())
    per_node = 20
    taint = [{"key": RESOURCE, "value": "present", "effect": "NoSchedule"}]
    for i in range(-(-quota // per_node)):
        docs.append(
            kwok_node(
                f"{ns}-{i}", {FLAVOR_LABEL: FLAVOR}, {RESOURCE: str(per_node), "pods": "500"}, taint
            )
        )
    for p in sorted({r["priority"] for r in data["requests"]}):
        docs.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"sbs-p{p}"},
                "value": p,
            }
        )
    docs += manifests(config, cluster_flavors(config, {}, {}), ns)
    return docs


def _pod_spec(req: dict[str, Any]) -> dict[str, Any]:
    """The pod of a request, for a Job's template and a Workload's podSet alike: one pause
    container asking for the request's GPUs, on the benchmark's flavor."""
    from jupyter_gpuaas.kubeapi.meta import FLAVOR_LABEL

    gpus = {RESOURCE: str(req["gpus"])}
    return {
        "restartPolicy": "Never",
        "nodeSelector": {FLAVOR_LABEL: FLAVOR},
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": gpus, "limits": gpus},
            }
        ],
    }


def _job(
    ns: str, index: int, req: dict[str, Any], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The request's suspended Job in its tenant's LocalQueue; `labels` instead of the
    plain queue and priority labels (kueue_mode: `kueue_labels`, with the request's id)."""

    run = f"{int(req['duration'] * 1000)}ms"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"j{index}",
            "namespace": ns,
            "labels": labels
            or {
                "kueue.x-k8s.io/queue-name": req["tenant"],
                "kueue.x-k8s.io/priority-class": f"sbs-p{req['priority']}",
            },
            "annotations": {"gpuaas.jupyter.org/request": req["id"]},
        },
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "annotations": {
                        "pod-complete.stage.kwok.x-k8s.io/delay": run,
                        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": run,
                    }
                },
                "spec": _pod_spec(req),
            },
        },
    }


def _workload(
    ns: str, name: str, req: dict[str, Any], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The request as a Workload of its own (`--workloads`, as Kueue's baseline runner
    creates them: no Job, no pod): one podSet of one pod asking for the request's GPUs, in
    its tenant's LocalQueue, with the WorkloadPriorityClass of its priority and its
    runtime in a label for the runner (`_Runner`). `labels`: kueue_mode's
    `kueue_labels`, with the request's id, on the Workload itself."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {**(labels or {}), RUNTIME_LABEL: str(int(req["duration"] * 1000))},
            "annotations": {"gpuaas.jupyter.org/request": req["id"]},
        },
        "spec": {
            "queueName": req["tenant"],
            "priorityClassRef": {
                "group": KUEUE_GROUP,
                "kind": "WorkloadPriorityClass",
                "name": f"sbs-p{req['priority']}",
            },
            "priority": req["priority"],
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {"spec": _pod_spec(req)},
                }
            ],
        },
    }


def _true(conditions: dict[str, dict[str, Any]], kind: str) -> bool:
    return conditions.get(kind, {}).get("status") == "True"


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class _Runner:
    """What Kueue's baseline runner (test/performance/scheduler/runner/controller) does
    for Workloads that no job controller owns, on a watch of the run's namespace: once a
    Workload is Admitted, it is marked Finished (a server-side apply of the condition to
    its status) after its runtime from the admission this process saw; once one is
    Evicted (preempted), its quota reservation is given up (QuotaReserved and Admitted
    false, no admission), which a job controller would otherwise do, so that Kueue can
    admit it again. Also records, per Workload name, when this process first saw its
    QuotaReserved and its Finished condition.

    The watch resumes from the last resourceVersion it saw (bookmarks included) and
    lists afresh only on 410 Gone."""

    def __init__(self, custom: Any, ns: str, runtimes: dict[str, float], count: int) -> None:
        self.custom, self.ns, self.runtimes, self.count = custom, ns, runtimes, count
        self.reserved: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self._admitted: dict[str, float] = {}  # name -> when its current admission was seen
        self._unreserving: set[tuple[str, str]] = set()  # (name, resourceVersion)
        self._tasks: set[asyncio.Task[None]] = set()
        self.finishes = self.evictions = self.relists = self.watches = 0
        self.errors: list[str] = []

    async def run(self, until: float) -> None:
        from kubernetes_asyncio import watch
        from kubernetes_asyncio.client.exceptions import ApiException

        rv: str | None = None
        try:
            while len(self.finished) < self.count and time.monotonic() < until:
                if rv is None:
                    listed = await self.custom.list_namespaced_custom_object(
                        KUEUE_GROUP, KUEUE_VERSION, self.ns, "workloads"
                    )
                    self.relists += 1
                    rv = listed["metadata"]["resourceVersion"]
                    for wl in listed.get("items") or []:
                        self._seen(wl)
                w = watch.Watch()
                self.watches += 1
                try:
                    async for ev in w.stream(
                        self.custom.list_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                        self.ns, "workloads", resource_version=rv, allow_watch_bookmarks=True,
                        timeout_seconds=60,
                    ):  # fmt: skip
                        obj = ev["object"]
                        rv = obj["metadata"].get("resourceVersion") or rv
                        if ev["type"] in ("ADDED", "MODIFIED"):
                            self._seen(obj)
                        if len(self.finished) >= self.count or time.monotonic() > until:
                            break
                except ApiException as e:
                    if e.status != 410:
                        raise
                    rv = None  # the revision was compacted away: list afresh
                except asyncio.TimeoutError:
                    pass
                finally:
                    await w.close()
        finally:
            for t in self._tasks:
                t.cancel()

    def _seen(self, wl: dict[str, Any]) -> None:
        name = wl["metadata"]["name"]
        conds = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
        now = time.monotonic()
        if _true(conds, "QuotaReserved"):
            self.reserved.setdefault(name, now)
        if _true(conds, "Finished"):
            self.finished.setdefault(name, now)
            self._admitted.pop(name, None)
            return
        evicted = _true(conds, "Evicted")
        if evicted and _true(conds, "QuotaReserved"):
            key = (name, wl["metadata"]["resourceVersion"])
            if key not in self._unreserving:
                self._unreserving.add(key)
                self._spawn(self._unreserve(wl, conds))
        if _true(conds, "Admitted") and not evicted:
            if name not in self._admitted:
                self._admitted[name] = now
                self._spawn(self._finish_after(name, now))
        else:
            self._admitted.pop(name, None)

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish_after(self, name: str, admitted: float) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        await asyncio.sleep(max(0.0, admitted + self.runtimes[name] - time.monotonic()))
        if self._admitted.get(name) != admitted:  # evicted or finished meanwhile
            return
        cond = {
            "type": "Finished",
            "status": "True",
            "reason": "ByTest",
            "message": "Finished after its runtime by the side-by-side runner",
            "lastTransitionTime": _stamp(),
        }
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": self.ns},
            "status": {"conditions": [cond]},
        }
        try:
            await self.custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP, KUEUE_VERSION, self.ns, "workloads", name, body,
                field_manager="kueue-side-by-side-Finished", force=True,
                _content_type="application/apply-patch+yaml",
            )  # fmt: skip
            self.finishes += 1
        except ApiException as e:
            self.errors.append(f"finish {name}: {e.status} {e.reason}")

    async def _unreserve(self, wl: dict[str, Any], conds: dict[str, dict[str, Any]]) -> None:
        """Give up an evicted Workload's quota reservation (Kueue's runner: "finish the
        workloads eviction"), against the resourceVersion seen: on a conflict the newer
        version comes on the watch and this runs again for it."""
        from kubernetes_asyncio.client.exceptions import ApiException

        now = _stamp()
        changed = {
            "QuotaReserved": ("Pending", "Evicted by the side-by-side runner"),
            "Admitted": ("NoReservation", "The workload has no reservation"),
        }
        out = []
        for kind, c in conds.items():
            if kind in changed and c.get("status") != "False":
                reason, message = changed[kind]
                c = {**c, "status": "False", "reason": reason, "message": message,
                     "lastTransitionTime": now}  # fmt: skip
            out.append(c)
        body = {
            "metadata": {"resourceVersion": wl["metadata"]["resourceVersion"]},
            "status": {"conditions": out, "admission": None},
        }
        try:
            await self.custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP, KUEUE_VERSION, self.ns, "workloads", wl["metadata"]["name"], body,
                _content_type="application/merge-patch+json",
            )  # fmt: skip
            self.evictions += 1
        except ApiException as e:
            if e.status != 409:
                self.errors.append(f"unreserve {wl['metadata']['name']}: {e.status} {e.reason}")

    def report(self) -> dict[str, Any]:
        return {
            "finished_by_runner": self.finishes,
            "evictions_completed": self.evictions,
            "watches": self.watches,
            "lists": self.relists,
            "errors": self.errors[:5],
        }


async def _observe(
    custom: Any,
    ns: str,
    admitted: dict[str, float],
    finished: dict[str, float],
    count: int,
    until: float,
) -> None:
    """Watch the Workloads of `ns` until `count` have finished or the clock passes `until`:
    when each Job's (by name) had its quota reserved, and when it finished, first seen."""
    from kubernetes_asyncio import watch

    w = watch.Watch()
    while len(finished) < count and time.monotonic() < until:
        try:
            async for ev in w.stream(
                custom.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2", ns,
                "workloads", timeout_seconds=30,
            ):  # fmt: skip
                wl = ev["object"]
                owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name")
                now = time.monotonic()
                for c in (wl.get("status") or {}).get("conditions") or []:
                    if c["status"] != "True":
                        continue
                    if c["type"] == "QuotaReserved":
                        admitted.setdefault(owner, now)
                    elif c["type"] == "Finished":
                        finished.setdefault(owner, now)
                if len(finished) >= count or now > until:
                    break
        except asyncio.TimeoutError:
            continue


async def _replay(
    kubeconfig: Path, ns: str, data: dict[str, Any], deadline: float, workloads: bool = False
) -> dict[str, Any]:
    from kubernetes_asyncio import client, config

    await config.load_kube_config(config_file=str(kubeconfig))
    api = client.ApiClient()
    batch = client.BatchV1Api(api)
    custom = client.CustomObjectsApi(api)
    requests = data["requests"]
    created: dict[str, float] = {}
    admitted: dict[str, float] = {}
    finished: dict[str, float] = {}
    late: list[float] = []  # how far behind its submit time each creation was sent
    runner = None
    if workloads:
        runner = _Runner(custom, ns, {f"w{i}": r["duration"] for i, r in enumerate(requests)},
                         len(requests))  # fmt: skip
        admitted, finished = runner.reserved, runner.finished
    start = time.monotonic()

    async def create() -> None:
        sem = asyncio.Semaphore(AT_ONCE)

        async def one(i: int, req: dict[str, Any]) -> None:
            await asyncio.sleep(max(0.0, start + req["submit"] - time.monotonic()))
            async with sem:
                now = time.monotonic()
                late.append(now - start - req["submit"])
                if workloads:
                    created[f"w{i}"] = now
                    await custom.create_namespaced_custom_object(
                        KUEUE_GROUP, KUEUE_VERSION, ns, "workloads", _workload(ns, f"w{i}", req)
                    )
                else:
                    created[f"j{i}"] = now
                    await batch.create_namespaced_job(ns, _job(ns, i, req))

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))

    watcher = (
        runner.run(start + deadline)
        if runner is not None
        else _observe(custom, ns, admitted, finished, len(requests), start + deadline)
    )
    try:
        await asyncio.gather(create(), watcher)
    finally:
        await api.close()
    waits: dict[str, list[float]] = {cls: [] for cls, *_ in kueue_baseline.CLASSES}
    for i, req in enumerate(requests):
        key = f"w{i}" if workloads else f"j{i}"
        if key in admitted:
            waits[kueue_baseline.class_of(req["id"])].append(admitted[key] - created[key])
    end = max(finished.values(), default=time.monotonic())
    lost = len(requests) - len(finished)
    out = summarize(waits, end - start, lost, time.monotonic() - start, data)
    out["submitted_late_s"] = _spread(late)
    if runner is not None:
        out["runner"] = runner.report()
    return out


@contextlib.contextmanager
def _on_cluster(
    data: dict[str, Any], cluster_dir: Path | None, wait: bool = False
) -> Iterator[tuple[Any, str, dict[str, Any]]]:
    """(the cluster, a namespace of this run's own, the scenario with its names) with the
    scenario's quota applied, KWOK nodes and all; everything removed afterwards (and the
    cluster stopped if it was started here). `wait`: until the namespace is gone (its
    thousands of Workloads deleted), so that the next column starts on a quiet control
    plane."""
    module = _cluster_module()
    own = cluster_dir is None or not (cluster_dir / "kubeconfig").exists()
    root = Path(tempfile.mkdtemp(prefix="sbs-cluster-")) if cluster_dir is None else cluster_dir
    cluster = module.up(root) if own else module.Cluster(root.resolve())
    ns = f"sbs-{uuid.uuid4().hex[:6]}"
    # Every name of Kueue's (cluster-wide) carries the run's token.
    data = {
        "flavors": data["flavors"],
        "tenants": {
            f"{ns}-{t}": {**spec, "cohort": f"{ns}-{spec['cohort']}"}
            for t, spec in data["tenants"].items()
        },
        "requests": [{**r, "tenant": f"{ns}-{r['tenant']}"} for r in data["requests"]],
    }
    try:
        cluster.apply(_objects(data, ns, module.kwok_node))
        yield cluster, ns, data
    finally:
        gone = ("--wait=true", "--timeout=180s") if wait else ("--wait=false",)
        cluster.kubectl("delete", "namespace", ns, *gone, check=False)
        names = [t for t in data["tenants"]]
        cluster.kubectl(
            "delete", "clusterqueues.kueue.x-k8s.io", *names, "--wait=false", check=False
        )
        nodes = cluster.kubectl("get", "nodes", "-o", "name").split()
        mine = [n for n in nodes if n.startswith(f"node/{ns}-")]
        if mine:
            cluster.kubectl("delete", *mine, "--wait=false", check=False)
        if own:
            module.down(root)


def run_kueue(
    data: dict[str, Any], cluster_dir: Path | None, deadline: float, workloads: bool = False
) -> dict[str, Any]:
    with _on_cluster(data, cluster_dir, wait=workloads) as (cluster, ns, named):
        return asyncio.run(_replay(cluster.kubeconfig, ns, named, deadline, workloads))


# ---------------------------------------------------------------------------------------
# Our gateway in Kueue mode

#: The benchmark's users: one per tenant (its holder), and a viewer who follows every
#: request on the event stream.
VIEWER = "sbs-viewer"


def _token(user: str) -> str:
    return f"tok-{user}-0123456789"


def _start_gateway(
    tmp: Path, kubeconfig: Path, ns: str, data: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], str]:
    """`jupyter-gpuaas gateway --admission kueue` in a process of its own (inheriting this
    one's niceness), following `ns`; (the process, its base URL)."""
    from gateway_load import free_port

    quotas = {k: data[k] for k in ("flavors", "tenants")}
    tokens: dict[str, Any] = {_token(VIEWER): {"user": VIEWER, "groups": [], "view": True}}
    for tenant in data["tenants"]:
        tokens[_token(tenant)] = {"user": tenant, "groups": [tenant]}
    (tmp / "quotas.yaml").write_text(yaml.safe_dump(quotas))
    (tmp / "tokens.yaml").write_text(yaml.safe_dump({"tokens": tokens}))
    port = free_port()
    flavor = data["flavors"][FLAVOR]
    argv = [
        sys.executable, "-m", "jupyter_gpuaas.gateway.app",
        "--ip=127.0.0.1", f"--port={port}",
        f"--quotas={tmp / 'quotas.yaml'}", f"--tokens={tmp / 'tokens.yaml'}",
        f"--devices=simulated:{FLAVOR}={flavor['nodes']}x{flavor['gpus_per_node']}",
        f"--db-url=sqlite:///{tmp / 'gpuaas.sqlite'}",
        "--admission=kueue", f"--kueue-namespace={ns}",
        "--GatewayApp.max_queued_per_user=0",
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    for k in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_NAME"):
        env.pop(k, None)
    log = tmp / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    url = f"http://127.0.0.1:{port}/"
    until = time.monotonic() + 120
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "api/openapi.json", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"gateway did not start:\n{log.read_text()[-3000:]}")


async def _replay_gateway(
    kubeconfig: Path,
    url: str,
    ns: str,
    data: dict[str, Any],
    deadline: float,
    pid: int,
    workloads: bool = False,
) -> dict[str, Any]:
    from gateway_load import cpu_seconds
    from kubernetes_asyncio import client, config

    from jupyter_gpuaas.client import GatewayClient
    from jupyter_gpuaas.kubernetes.pods import kueue_labels

    await config.load_kube_config(config_file=str(kubeconfig))
    api = client.ApiClient()
    batch = client.BatchV1Api(api)
    requests = data["requests"]
    holders = {t: GatewayClient(url, _token(t)) for t in data["tenants"]}
    viewer = GatewayClient(url, _token(VIEWER))
    submitted: dict[str, float] = {}  # request id -> when its holder submitted
    ids: dict[int, str] = {}  # index in the scenario -> request id
    admitted: dict[str, float] = {}
    finished: dict[str, float] = {}
    ended: dict[str, str] = {}  # request id -> the event that ended it
    errors: list[str] = []
    done = asyncio.Event()
    listening = asyncio.Event()

    async def follow() -> None:
        async for ev in viewer.events(comments=True):
            if "comment" in ev:
                listening.set()
                continue
            rid, now = (ev.get("data") or {}).get("id"), time.monotonic()
            if ev["event"] == "admit":
                admitted.setdefault(rid, now)
            elif ev["event"] in ("finish", "cancel", "expire"):
                finished.setdefault(rid, now)
                ended.setdefault(rid, ev["event"])
            if len(finished) >= len(requests) and len(submitted) >= len(requests):
                done.set()

    follower = asyncio.ensure_future(follow())
    await asyncio.wait_for(listening.wait(), 30)
    cpu0 = cpu_seconds(pid)
    start = time.monotonic()
    # Kueue's own decisions, watched as the `kueue` column watches them: how far the
    # gateway's events lag behind them.
    reserved: dict[str, float] = {}
    kueue_finished: dict[str, float] = {}
    custom = client.CustomObjectsApi(api)
    runner = None
    if workloads:  # the runner finishes them (no Job, no pod), and watches as it does
        runner = _Runner(custom, ns, {f"w{i}": r["duration"] for i, r in enumerate(requests)},
                         len(requests))  # fmt: skip
        reserved, kueue_finished = runner.reserved, runner.finished
    watcher = asyncio.ensure_future(
        runner.run(start + deadline)
        if runner is not None
        else _observe(custom, ns, reserved, kueue_finished, len(requests), start + deadline)
    )
    late: list[float] = []

    async def one(i: int, req: dict[str, Any]) -> None:
        await asyncio.sleep(max(0.0, start + req["submit"] - time.monotonic()))
        async with sem:
            at = time.monotonic()
            late.append(at - start - req["submit"])
            try:
                made = await holders[req["tenant"]].submit(
                    req["tenant"], "job", req["gpus"], FLAVOR, req["priority"], name=req["id"]
                )
                submitted[made["id"]], ids[i] = at, made["id"]
                labels = kueue_labels(
                    req["tenant"],
                    user=req["tenant"],
                    kind="job",
                    priority_class=f"sbs-p{req['priority']}",
                    request=made["id"],
                )
                if workloads:
                    await custom.create_namespaced_custom_object(
                        KUEUE_GROUP, KUEUE_VERSION, ns, "workloads",
                        _workload(ns, f"w{i}", req, labels),
                    )  # fmt: skip
                else:
                    await batch.create_namespaced_job(ns, _job(ns, i, req, labels))
            except Exception as e:  # one bad request fails alone; counted as lost
                errors.append(f"{req['id']}: {e}")

    sem = asyncio.Semaphore(AT_ONCE)
    try:
        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        if len(finished) < len(requests):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), max(0.0, start + deadline - time.monotonic()))
        wall = time.monotonic() - start
        cpu = cpu_seconds(pid) - cpu0
        # The gateway's own view: every request read back from its store.
        store = await _bounded(viewer.get(rid) for rid in ids.values())
    finally:
        follower.cancel()
        watcher.cancel()
        await api.close()
    waits: dict[str, list[float]] = {cls: [] for cls, *_ in kueue_baseline.CLASSES}
    lag_admit: list[float] = []
    lag_finish: list[float] = []
    for i, req in enumerate(requests):
        rid, key = ids.get(i), f"w{i}" if workloads else f"j{i}"
        if rid in admitted:
            waits[kueue_baseline.class_of(req["id"])].append(admitted[rid] - submitted[rid])
            if key in reserved:
                lag_admit.append(admitted[rid] - reserved[key])
        if rid in finished and key in kueue_finished:
            lag_finish.append(finished[rid] - kueue_finished[key])
    end = max(finished.values(), default=time.monotonic())
    lost = len(requests) - sum(1 for e in ended.values() if e == "finish")
    out = summarize(waits, end - start, lost, wall, data)
    out["gateway"] = {
        "requests": len(requests),
        "submitted": len(ids),
        "reached_admitted": sum(1 for r in store if r.get("admitted_at") is not None),
        "finished": sum(1 for r in store if r["state"] == "finished"),
        "states": dict(Counter(r["state"] for r in store)),
        "cpu_s": round(cpu, 1),
        # Seconds from Kueue's decision (its Workload's condition, seen by a watch of
        # this process) to the gateway's event: p50, p95, max.
        "admit_lag_s": _spread(lag_admit),
        "finish_lag_s": _spread(lag_finish),
        "errors": errors[:5],
        "error_count": len(errors),
    }
    out["submitted_late_s"] = _spread(late)
    if runner is not None:
        out["runner"] = runner.report()
    return out


async def _bounded(work: Iterable[Awaitable[Any]], at_once: int = 32) -> list[Any]:
    """Every awaitable's result, in order, at most `at_once` of them in flight (15,000
    reads at once would only queue in the gateway)."""
    sem = asyncio.Semaphore(at_once)

    async def one(w: Awaitable[Any]) -> Any:
        async with sem:
            return await w

    return list(await asyncio.gather(*(one(w) for w in work)))


def _spread(values: list[float]) -> list[float] | None:
    if not values:
        return None
    return [round(_bench.percentile(values, q), 3) for q in (50, 95, 100)]


def run_kueue_mode(
    data: dict[str, Any], cluster_dir: Path | None, deadline: float, workloads: bool = False
) -> dict[str, Any]:
    with (
        _on_cluster(data, cluster_dir, wait=workloads) as (cluster, ns, named),
        tempfile.TemporaryDirectory(prefix="sbs-gateway-") as tmp,
    ):
        proc, url = _start_gateway(Path(tmp), cluster.kubeconfig, ns, named)
        try:
            return asyncio.run(
                _replay_gateway(cluster.kubeconfig, url, ns, named, deadline, proc.pid, workloads)
            )
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---------------------------------------------------------------------------------------

#: The columns: a function (scenario data, args) -> summarize(...)'s dict each.
ENGINES: dict[str, Callable[[dict[str, Any], argparse.Namespace], dict[str, Any]] | None] = {
    "kueue": lambda data, a: run_kueue(data, a.cluster_dir, a.deadline, a.workloads),
    "kueue_mode": lambda data, a: run_kueue_mode(data, a.cluster_dir, a.deadline, a.workloads),
    "core": lambda data, a: run_core(data),
}


def text(r: dict[str, Any]) -> str:
    lines = [
        f"Kueue baseline x{r['scale']}: {r['requests']} requests, {r['tenants']} tenants"
        f" in {r['cohorts']} cohorts, submitted as {r['submitted_as']};"
        f" quota-bound floor {r['floor_s']} s",
        "  engine      makespan  x floor  wall     lost  class   admitted  wait p50  wait p95",
    ]
    for name, e in r["engines"].items():
        if e is None:
            lines.append(f"  {name:<11} (not run)")
            continue
        first = True
        for cls, c in e["classes"].items():
            head = (
                f"  {name:<11} {e['makespan_s']:>7.1f}s {e['over_floor']:>7}x {e['wall_s']:>6.1f}s"
                f" {e['lost']:>5}"
                if first
                else " " * 45
            )
            p50 = "-" if c["wait_p50"] is None else f"{c['wait_p50']:.2f}s"
            p95 = "-" if c["wait_p95"] is None else f"{c['wait_p95']:.2f}s"
            lines.append(f"{head}  {cls:<7} {c['admitted']:>8}  {p50:>8}  {p95:>8}")
            first = False
    gw = (r["engines"].get("kueue_mode") or {}).get("gateway")
    if gw:
        lines.append(
            f"  kueue_mode, the gateway's store: {gw['reached_admitted']} of {gw['requests']}"
            f" reached admitted, {gw['finished']} finished ({gw['states']});"
            f" gateway CPU {gw['cpu_s']} s; its events after Kueue's decisions (p50/p95/max):"
            f" admit {gw['admit_lag_s']} s, finish {gw['finish_lag_s']} s"
        )
        lines += [f"  error: {e}" for e in gw["errors"]]
    return "\n".join(lines) + "\n"


def _sample_load(into: list[float], every: float = 10.0) -> threading.Event:
    """Append the 1-minute load average to `into` every `every` seconds until the
    returned event is set."""
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            into.append(os.getloadavg()[0])

    threading.Thread(target=sample, daemon=True).start()
    return stop


def main(argv: list[str] | None = None) -> int:
    global AT_ONCE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cohorts", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=3, help="tenants per cohort")
    parser.add_argument("--scale", type=float, default=0.1, help="of each class's count")
    parser.add_argument("--cluster-dir", type=Path, help="a running cluster (make cluster-up)")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds for Kueue")
    parser.add_argument("--only", help="comma-separated engines (default: all)")
    parser.add_argument(
        "--at-once", type=int, default=AT_ONCE, help="creations in flight at once (16)"
    )
    parser.add_argument(
        "--workloads",
        action="store_true",
        help="create Workload objects directly and finish them after their runtime, as"
        " Kueue's own baseline runner does (no Jobs, no pods); default: suspended Jobs",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = scenario(args.cohorts, args.tenants, args.scale)
    only = set(args.only.split(",")) if args.only else set(ENGINES)
    engines: dict[str, Any] = {}
    load: dict[str, list[float]] = {}  # the machine's load average around each engine
    load_range: dict[str, list[float]] = {}
    AT_ONCE = args.at_once
    for name, run in ENGINES.items():
        before = os.getloadavg()[0]
        seen = [before]
        sampler = _sample_load(seen)
        engines[name] = run(data, args) if run is not None and name in only else None
        sampler.set()
        # Each column on stderr as it ends: a run cut short keeps the columns it finished.
        print(json.dumps({"engine": name, "result": engines[name]}), file=sys.stderr, flush=True)
        load[name] = [round(before, 2), round(os.getloadavg()[0], 2)]
        load_range[name] = [round(min(seen), 2), round(max(seen), 2)]
    r = {
        "benchmark": "kueue_side_by_side",
        "scale": args.scale,
        "cohorts": args.cohorts,
        "tenants": args.cohorts * args.tenants,
        "requests": len(data["requests"]),
        "submitted_as": "workloads" if args.workloads else "jobs",
        "floor_s": floor(data),
        "machine": _bench.machine(),
        "load_average_1m": load,
        # lowest and highest 1-minute load average sampled every 10 s over each column
        "load_average_1m_range": load_range,
        "at_once": args.at_once,
        "engines": engines,
    }
    _bench.emit(r, args.json, text(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
