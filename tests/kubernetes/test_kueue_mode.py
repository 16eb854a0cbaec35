"""Kueue mode (`--admission kueue`, issue 42 item 2) on the REAL control plane: the real
Kueue 0.19 controller decides, the gateway follows its Workloads and shows them.

One test's own quota (a ResourceFlavor, ClusterQueue and LocalQueue that
`jupyter-gpuaas kueue manifests` prints for a quota file of one tenant with one GPU, on a
KWOK Node of the test's flavor), and Jobs created with kubectl, outside jupyter-gpuaas, in
the tenant's LocalQueue: the first is admitted by Kueue, the second waits with Kueue's
reason in words and its position from Kueue's visibility API, is admitted when the first
Job is deleted, and finishes when KWOK completes its pod. Then a GPU kernel's pod as our
builder makes it in Kueue mode (its LocalQueue label) goes through Kueue's pod integration:
gated, admitted, bound by the real scheduler, and ended when deleted. The store is read
back through `api/requests` (the gateway answers from it), and the event stream tells the
same story. That gateway reaches the API server as a ServiceAccount with only the rules
`kubernetes manifests --admission kueue` gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import wait_until
from kubefix import TOKENS
from kubeutil import (
    KubeOnCluster,
    connect,
    kernel_cluster,
    kube_spawner,
    run_cell,
    service_account_kubeconfig,
    start_gateway,
)
from tornado.httpclient import AsyncHTTPClient
from traitlets.config import Config

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.kubernetes.kernel_pods import kernel_pod_manifest
from jupyter_gpuaas.kubernetes.manifests import rules

pytestmark = pytest.mark.asyncio

HEADERS = {"Authorization": f"token {TOKENS['root']}"}


def job(name: str, queue: str, *, user: str | None = None, seconds: int | None = None) -> Any:
    """A batch/v1 Job of one pod asking for one GPU, in Kueue's queue `queue` (a Job as a
    person writes it for kubectl; KWOK completes its pod after `seconds`)."""
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if user is not None:
        labels["gpuaas.jupyter.org/user"] = user
    pod_notes = {}
    if seconds is not None:  # KWOK completes it between the delay and the jitter-delay
        pod_notes["pod-complete.stage.kwok.x-k8s.io/delay"] = f"{seconds}s"
        pod_notes["pod-complete.stage.kwok.x-k8s.io/jitter-delay"] = f"{seconds}s"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": pod_notes},
                "spec": {
                    "restartPolicy": "Never",
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "train",
                            "image": "python:3.12",
                            "resources": {
                                "requests": {"nvidia.com/gpu": "1"},
                                "limits": {"nvidia.com/gpu": "1"},
                            },
                        }
                    ],
                },
            },
        },
    }


async def requests_of(url: str) -> dict[str, dict[str, Any]]:
    resp = await AsyncHTTPClient().fetch(url + "api/requests?limit=100", headers=HEADERS)
    body = json.loads(resp.body)
    items = body["requests"] if isinstance(body, dict) else body
    return {r["name"]: r for r in items if r.get("name")}


class KueueQuota:
    """One test's own Kueue quota: a flavor on a KWOK Node of its own (only the test's
    jobs fit there), a tenant of one GPU, and the objects `jupyter-gpuaas kueue manifests`
    prints for them, applied to the real API server."""

    def __init__(
        self, kube: KubeOnCluster, tmp_path: Path, name: str | None = None, **tenant: Any
    ) -> None:
        self.kube, self.tag = kube, uuid.uuid4().hex[:6]
        self.flavor, self.tenant = f"kq-gpu-{self.tag}", name or f"kq-team-{self.tag}"
        self.node = f"kq-node-{self.tag}"
        kube.add_node(
            self.node,
            labels={"gpuaas.jupyter.org/flavor": self.flavor},
            allocatable={"nvidia.com/gpu": "1"},
            taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        )
        self.quotas = {
            "flavors": {self.flavor: {"nodes": 1, "gpus_per_node": 1}},
            "tenants": {self.tenant: {"quota": {self.flavor: 1}, **tenant}},
            "policy": {"idle_timeout": 0, "reservation_ttl": 0},
        }
        qfile = tmp_path / "kq.yaml"
        qfile.write_text(yaml.safe_dump(self.quotas))
        cli = [sys.executable, "-m", "jupyter_gpuaas.cli", "kueue", "manifests", str(qfile)]
        printed = subprocess.run(
            [*cli, "--namespace", kube.namespace], capture_output=True, text=True, check=True
        ).stdout
        objects = [o for o in yaml.safe_load_all(printed) if o]
        assert [o["kind"] for o in objects] == ["ResourceFlavor", "ClusterQueue", "LocalQueue"]
        kube.cluster.apply(objects)

    async def gateway(
        self, tmp_path: Path, db_url: str | None = None, intent_timeout: float = 120.0
    ) -> Any:
        """The real gateway in Kueue mode, following the test's namespace."""
        config = Config()
        config.GatewayApp.admission = "kueue"
        config.GatewayApp.kueue_namespace = self.kube.namespace
        config.GatewayApp.kueue_interval = 0.3
        config.GatewayApp.kueue_intent_timeout = intent_timeout
        return await start_gateway(
            tmp_path,
            quotas=self.quotas,
            devices=f"simulated:{self.flavor}=1x1",
            config=config,
            db_url=db_url,
        )

    def run(self, *objects: Any) -> None:
        self.kube.cluster.apply(list(objects), "-n", self.kube.namespace)

    def close(self) -> None:
        self.kube.cluster.kubectl(
            "delete",
            "clusterqueue",
            self.tenant,
            "resourceflavor",
            self.flavor,
            "--wait=false",
            check=False,
        )


def as_the_gateways_account(
    kube: KubeOnCluster, tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Make the gateway talk to the API server with the token of a ServiceAccount holding
    only the rules `kubernetes manifests --admission kueue` gives the gateway: RBAC, not
    the admin certificate, decides (a verb missing there fails this test). Returns the
    ClusterRole's name (cluster-scoped: the caller deletes it)."""
    from kubernetes_asyncio.config import kube_config

    cluster_rules, namespaced = rules("none", "kueue")
    path = service_account_kubeconfig(kube, "gpuaas", namespaced, tmp_path / "gateway.kubeconfig")
    name = f"gpuaas-kueue-{tag}"
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    subject = {"kind": "ServiceAccount", "name": "gpuaas", "namespace": kube.namespace}
    kube.cluster.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": cluster_rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": ref,
                "subjects": [subject],
            },
        ]
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return name


async def test_a_job_from_outside_queues_and_runs_by_kueues_decisions(
    kube: KubeOnCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quota = KueueQuota(kube, tmp_path)
    tag, flavor, tenant, node = quota.tag, quota.flavor, quota.tenant, quota.node
    role = as_the_gateways_account(kube, tag, tmp_path, monkeypatch)
    gw = await quota.gateway(tmp_path)
    events: list[dict[str, Any]] = []
    listening = asyncio.get_running_loop().create_task(listen(gw.url, events))
    try:
        # The first Job takes the tenant's one GPU (it would run for an hour).
        kube.cluster.apply([job("first", tenant, seconds=3600)], "-n", kube.namespace)
        first = await wait_until(
            lambda: admitted(gw.url, "first"), timeout=60, what="the first Job admitted"
        )
        assert first["user"] == "outside jupyter-gpuaas"
        assert first["tenant"] == tenant and first["kind"] == "job" and first["gpus"] == 1
        assert first["grant"]["flavor"] == flavor
        assert first["grant"]["lease_expires"] is None  # Kueue has no leases
        # The node comes from the Job's pod, once the real scheduler bound it.
        await wait_until(
            lambda: field_is(gw.url, "first", lambda r: (r["grant"] or {}).get("node") == node),
            timeout=60,
            what="the first Job's node",
        )

        # The second waits: Kueue's reason in words, its place from the visibility API.
        kube.cluster.apply([job("second", tenant, user="carol", seconds=1)], "-n", kube.namespace)

        def reasoned(r: dict[str, Any]) -> bool:
            return r["state"] == "queued" and (r.get("waiting_for") or {}).get("kind") == "quota"

        second = await wait_until(
            lambda: field_is(gw.url, "second", reasoned), timeout=60, what="second's reason"
        )
        assert second["user"] == "carol"
        message = second["waiting_for"]["message"]
        assert f"all of {tenant}'s {flavor} quota is in use: 1 more GPU" in message, message
        engine = gw.arbiter.kueue
        await wait_until(lambda: second["id"] in engine.positions, what="a visible position")
        second = await wait_until(
            lambda: field_is(gw.url, "second", lambda r: r["position"] is not None),
            timeout=30,
            what="second's position",
        )
        assert second["position"]["tenant"] == 1 and second["position"]["of"] == 1
        assert engine.visibility == "answers"
        # The admin page and the metrics show the whole queue, Kueue's as it is.
        page = await AsyncHTTPClient().fetch(gw.url, headers=HEADERS)
        assert f"Job second ({kube.namespace})" in page.body.decode()

        async def counted() -> bool:
            resp = await AsyncHTTPClient().fetch(gw.url + "metrics", headers=HEADERS)
            return any(
                line.startswith("gpuaas_pending_requests{")
                and f'tenant="{tenant}"' in line
                and 'kind="job"' in line
                and line.endswith(" 1.0")
                for line in resp.body.decode().splitlines()
            )

        await wait_until(counted, what="the pending Job in the metrics")

        # The first Job deleted: its request ends, and the real Kueue admits the second.
        kube.cluster.kubectl("delete", "job", "first", "-n", kube.namespace, "--wait=false")
        await wait_until(
            lambda: field_is(gw.url, "first", lambda r: r["state"] == "finished"),
            timeout=60,
            what="the first request finished",
        )
        second = await wait_until(
            lambda: admitted(gw.url, "second"), timeout=60, what="the second Job admitted"
        )
        assert second["grant"]["flavor"] == flavor
        # KWOK completes its pod; the Job controller the Job; Kueue the Workload.
        second = await wait_until(
            lambda: field_is(gw.url, "second", lambda r: r["state"] == "finished"),
            timeout=60,
            what="the second request finished",
        )
        assert "Succeeded" in (second["reason"] or "")

        # The event stream heard the same story, in the order it was committed.
        def story() -> list[str]:
            rid = second["id"]
            return [e["event"] for e in events if e.get("id") == rid]

        await wait_until(lambda: story()[-1:] == ["finish"], what="the stream's finish")
        assert story() == ["submit", "admit", "finish"]

        # A GPU kernel's pod as our builder makes it in Kueue mode: Kueue's pod integration
        # gates it, admits it, the scheduler binds it; deleted, its request ends.
        pod = kernel_pod_manifest(
            name=f"kernel-{tag}",
            kernel_id=tag,
            user="alice",
            command=["python", "-m", "ipykernel_launcher"],
            image="quay.io/jupyter/pytorch-notebook",
            request={"gpus": 1, "tenant": tenant, "flavor": flavor, "grant": None},
            flavors={flavor: {"node_selector": {"gpuaas.jupyter.org/flavor": flavor}}},
            queue=tenant,
        )
        pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        kube.cluster.apply([pod], "-n", kube.namespace)
        kernel = await wait_until(
            lambda: admitted(gw.url, f"kernel-{tag}", kind="Pod"),
            timeout=60,
            what="the kernel pod admitted",
        )
        assert (kernel["user"], kernel["kind"], kernel["tenant"]) == ("alice", "kernel", tenant)
        assert kernel["grant"]["flavor"] == flavor
        await wait_until(
            lambda: field_is(
                gw.url,
                f"kernel-{tag}",
                lambda r: (r["grant"] or {}).get("node") == node,
                kind="Pod",
            ),
            timeout=60,
            what="the kernel pod bound",
        )
        kube.cluster.kubectl("delete", "pod", f"kernel-{tag}", "-n", kube.namespace, "--wait=false")
        await wait_until(
            lambda: field_is(
                gw.url, f"kernel-{tag}", lambda r: r["state"] == "finished", kind="Pod"
            ),
            timeout=60,
            what="the kernel's request finished",
        )
    finally:
        listening.cancel()
        await gw.stop_server()
        quota.close()
        kube.cluster.kubectl(
            "delete", "clusterrolebinding,clusterrole", role, "--wait=false", check=False
        )


async def test_kueue_preempts_and_a_restarted_gateway_catches_up(
    kube: KubeOnCluster, tmp_path: Path, db_url: str
) -> None:
    """A higher-priority Job makes the real Kueue preempt a running one (`preempt`, then
    `requeue`: Kueue requeues it); then the gateway stops, the winner's Job is deleted
    while it is down, and a new gateway on the same store restores both requests, ends the
    one whose Workload is gone, and sees Kueue admit the other again. On SQLite and on
    PostgreSQL, the cluster mode's store."""
    quota = KueueQuota(kube, tmp_path, preemption={"within_tenant": "LowerPriority"})
    high = f"kq-high-{quota.tag}"
    kube.cluster.apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": high},
                "value": 1000,
            }
        ]
    )
    gw = await quota.gateway(tmp_path, db_url)
    try:
        quota.run(job("low", quota.tenant, seconds=3600))
        low = await wait_until(lambda: admitted(gw.url, "low"), timeout=60, what="low admitted")
        urgent = job("urgent", quota.tenant, seconds=3600)
        urgent["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = high
        quota.run(urgent)
        await wait_until(lambda: admitted(gw.url, "urgent"), timeout=60, what="urgent admitted")
        low = await wait_until(
            lambda: field_is(gw.url, "low", lambda r: r["state"] == "queued"),
            timeout=60,
            what="low preempted and queued again",
        )
        assert low["admitted_at"] is not None  # it ran before
        assert (
            low["reason"]
            == f"preempted by Kueue for a workload of higher priority in {quota.tenant}"
        )
        # The store's decision log: what Kueue decided, as the gateway recorded it.
        logged = [d.event for d in gw.arbiter.store.decisions(low["id"])]
        assert logged == ["submit", "admit", "preempt", "requeue"], logged
    finally:
        await gw.stop_server()
    try:
        # While no gateway runs: the urgent Job goes; Kueue admits low again.
        kube.cluster.kubectl("delete", "job", "urgent", "-n", kube.namespace, "--wait=false")
        again = await quota.gateway(tmp_path, db_url)  # the same store
        try:
            await wait_until(
                lambda: field_is(again.url, "urgent", lambda r: r["state"] == "finished"),
                timeout=60,
                what="the urgent request ended by the restarted gateway",
            )
            back = await wait_until(
                lambda: admitted(again.url, "low"), timeout=60, what="low admitted again"
            )
            assert back["id"] == low["id"] and back["grant"]["flavor"] == quota.flavor
            assert back["grant"]["lease_expires"] is None
        finally:
            await again.stop_server()
    finally:
        quota.close()


async def field_is(url: str, name: str, test: Any, kind: str = "Job") -> dict[str, Any] | None:
    """The request of the Job (or Pod) `name`, named "<kind> <name> (<namespace>)" by the
    gateway, when `test` holds."""
    items = await requests_of(url)
    found = next((r for n, r in items.items() if n.startswith(f"{kind} {name} (")), None)
    return found if found is not None and test(found) else None


async def admitted(url: str, name: str, kind: str = "Job") -> dict[str, Any] | None:
    return await field_is(url, name, lambda r: r["state"] == "admitted", kind)


async def listen(url: str, into: list[dict[str, Any]]) -> None:
    """The gateway's event stream (SSE), every event's data appended to `into`."""
    buffer = b""

    def chunk(data: bytes) -> None:
        nonlocal buffer
        buffer += data
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            for line in block.decode().splitlines():
                if line.startswith("data:"):
                    into.append(json.loads(line[5:]))

    await AsyncHTTPClient().fetch(
        url + "api/events", headers=HEADERS, streaming_callback=chunk, request_timeout=0
    )


async def test_the_kueue_mode_manifests_apply_to_the_real_api_server(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """`kubernetes manifests --admission kueue`: the API server takes every object
    (strict field validation), the gateway's config says Kueue decides, in its namespace,
    and its Role and ClusterRole hold the rules the test above runs the gateway with."""
    qfile = tmp_path / "quotas.yaml"
    quotas = {
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
        "tenants": {"vision": {"quota": {"a100": 2}}},
    }
    qfile.write_text(yaml.safe_dump(quotas))
    cli = [sys.executable, "-m", "jupyter_gpuaas.cli", "kubernetes", "manifests"]
    out = subprocess.run(
        [*cli, "--quotas", str(qfile), "--namespace", kube.namespace, "--scale-up", "none",
         "--admission", "kueue"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    kube.cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--validate=strict", "-f", "-", input=out
    )
    try:
        maps = [d["data"] for d in docs if d["kind"] == "ConfigMap"]
        config = json.loads(
            next(m["gpuaas_config.json"] for m in maps if "gpuaas_config.json" in m)
        )
        assert config["GatewayApp"] == {"admission": "kueue", "kueue_namespace": kube.namespace}
        cluster_rules, namespaced = rules("none", "kueue")
        assert namespaced in [d["rules"] for d in docs if d["kind"] == "Role"]
        assert cluster_rules in [d["rules"] for d in docs if d["kind"] == "ClusterRole"]
    finally:
        for d in docs:
            if not d["metadata"].get("namespace"):
                kube.cluster.kubectl(
                    "delete", d["kind"].lower(), d["metadata"]["name"], "--wait=false", check=False
                )


async def test_a_gpu_kernel_goes_through_kueue_and_the_api_cancels_through_it(
    kube: KubeOnCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our holder in Kueue mode: the real `gpuaas-kubernetes` provisioner (under
    jupyter_client's AsyncKernelManager, as kubeutil's kernel_cluster runs it) submits its
    request, creates its pod at once with the tenant's LocalQueue and the request's id,
    Kueue's pod integration gates it, and the request the kernel holds (not a second one
    of the Workload's) waits with Kueue's reason and position, is admitted by Kueue once
    a Job outside jupyter-gpuaas goes, and runs a cell in the pod the scheduler bound;
    shutdown ends it. Then cancels through the API: a queued kernel's request (its pod is
    deleted, its start fails with the reason) and a Job's (its Workload deactivated)."""
    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    quota = KueueQuota(kube, tmp_path, name="vision")
    tenant, flavor, node = quota.tenant, quota.flavor, quota.node
    flavors = {
        flavor: {
            "node_selector": {"gpuaas.jupyter.org/flavor": flavor},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        }
    }
    mine = {"gpuaas-test": kube.namespace}
    kube.add_node(f"kq-cpu-{quota.tag}", mine)
    gw = await quota.gateway(tmp_path)
    root = GatewayClient(gw.url, TOKENS["root"])
    try:
        quota.run(job("blocker", tenant, seconds=3600))
        blocker = await wait_until(
            lambda: admitted(gw.url, "blocker"), timeout=60, what="the blocker admitted"
        )
        async with kernel_cluster(kube, gw.url, tmp_path, monkeypatch, flavors, mine) as cl:
            write_spec(tmp_path / "kernels" / "gpu-kueue", 1, flavor, kubernetes=True)
            km = cl.kernel_manager("gpu-kueue", tenant=tenant, kueue_queue="{tenant}")
            start = asyncio.ensure_future(km.start_kernel(cwd=str(cl.home / "proj")))
            try:
                record = await wait_until(
                    lambda: (
                        (r := getattr(km.provisioner, "record", None))
                        and r.state == "queued"
                        and r.position
                        and r
                    ),
                    timeout=60,
                    what="the kernel queued with a position",
                )
                rid = record.request_id
                assert record.position["tenant"] == 1  # from Kueue's visibility API
                # The pod exists, gated by Kueue's pod integration, in the tenant's queue.
                pod = cl.pod(km)
                assert pod is not None
                labels = pod["metadata"]["labels"]
                assert labels["kueue.x-k8s.io/queue-name"] == tenant
                assert labels["gpuaas.jupyter.org/request"] == rid
                assert labels["kueue.x-k8s.io/managed"] == "true"
                assert {"name": "kueue.x-k8s.io/admission"} in pod["spec"]["schedulingGates"]
                # The kernel's own request shows Kueue's reason, in words.
                queued = await wait_until(
                    lambda: field_is_id(gw.url, rid, lambda r: r.get("waiting_for")),
                    timeout=60,
                    what="the kernel's reason from Kueue",
                )
                assert queued["waiting_for"]["kind"] == "quota", queued
                assert (
                    f"all of {tenant}'s {flavor} quota is in use"
                    in (queued["waiting_for"]["message"])
                )
                # The blocker goes: Kueue admits the kernel's pod, the kernel starts.
                await root.cancel(blocker["id"])  # its Workload deactivated, through us
                await asyncio.wait_for(start, 120)
                pod = cl.pod(km)
                assert pod is not None and pod["spec"]["nodeName"] == node
                assert not pod["spec"].get("schedulingGates")
                request = await root.get(rid)
                assert request["state"] == "admitted"
                assert request["grant"]["flavor"] == flavor
                # One request: the Workload drove the kernel's, made none of its own.
                names = await requests_of(gw.url)
                assert not any(n.startswith(f"Pod alice-{km.kernel_id}") for n in names)
                client = await connect(km)
                assert (await run_cell(client, "print(6 * 7)"))["out"] == "42\n"
                client.stop_channels()
                # The blocker's Workload was deactivated: Kueue suspended the Job.
                got = kube.cluster.kubectl("get", "job/blocker", "-n", kube.namespace, "-o=yaml")
                job_now = yaml.safe_load(got)
                assert job_now["spec"]["suspend"] is True
                assert (await root.get(blocker["id"]))["state"] == "finished"

                # A second kernel waits behind the first; the admin cancels its request.
                km2 = cl.kernel_manager("gpu-kueue", tenant=tenant, kueue_queue="{tenant}")
                start2 = asyncio.ensure_future(km2.start_kernel(cwd=str(cl.home / "proj")))
                try:
                    second = await wait_until(
                        lambda: (
                            (r := getattr(km2.provisioner, "record", None))
                            and r.state == "queued"
                            and cl.pod(km2) is not None
                            and r
                        ),
                        timeout=60,
                        what="the second kernel queued, its pod made",
                    )
                    await root.cancel(second.request_id)
                    with pytest.raises(Exception, match="cancelled"):
                        await asyncio.wait_for(start2, 60)
                    await wait_until(lambda: cl.pod(km2) is None, timeout=60, what="pod 2 gone")
                    assert (await root.get(second.request_id))["state"] == "cancelled"
                finally:
                    if not start2.done():
                        start2.cancel()

                # Shutdown: the pod goes, and with it the Workload; the request ends.
                await km.shutdown_kernel()
                assert cl.pod(km) is None
                assert (await root.get(rid))["state"] == "finished"
                assert record.state == "released"
            finally:
                if not start.done():
                    start.cancel()
                if km.has_kernel:
                    await km.shutdown_kernel(now=True)
    finally:
        await gw.stop_server()
        kube.cluster.kubectl("delete", "job", "blocker", "-n", kube.namespace, check=False)
        quota.close()


async def gone(kube: KubeOnCluster, *what: str) -> None:
    """Wait until a cluster-scoped object another test deleted without waiting is gone
    (a ClusterQueue keeps Kueue's finalizer while it has Workloads)."""

    def absent() -> bool:
        return not kube.cluster.kubectl("get", *what, "--ignore-not-found").strip()

    await wait_until(absent, timeout=60, what=f"{' '.join(what)} gone")


@dataclasses.dataclass
class Preemptible:
    """The set-up of the preemption tests (`preemptible_vision`): tenant "vision" whose
    ClusterQueue preempts lower priorities within it, a WorkloadPriorityClass above every
    holder of ours (`high`), and the flavor's placement (`flavors`)."""

    kube: KubeOnCluster
    quota: KueueQuota
    high: str
    flavors: dict[str, Any]

    def take_back(self) -> None:
        """An outside Job of the `high` priority takes the tenant's GPU back: Kueue
        preempts the holder of ours that has it."""
        urgent = job("urgent", self.quota.tenant, seconds=3600)
        urgent["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = self.high
        self.quota.run(urgent)

    def server_spawner(self, gw_url: str, **more: Any) -> Any:
        """alice's QueuedKubeSpawner in Kueue mode, for one GPU of the tenant's flavor."""
        spawner = kube_spawner(
            self.kube.url,
            gw_url,
            namespace=self.kube.namespace,
            flavors=self.flavors,
            kueue_queue="{tenant}",
            start_timeout=60,
            **more,
        )
        spawner.user_options = {"tenant": self.quota.tenant, "flavor": self.quota.flavor, "gpus": 1}
        return spawner

    def close(self) -> None:
        """The outside Job, the priority class and the quota, gone."""
        kubectl = self.kube.cluster.kubectl
        kubectl("delete", "job", "urgent", "-n", self.kube.namespace, check=False)
        kubectl("delete", "workloadpriorityclass", self.high, "--wait=false", check=False)
        self.quota.close()


async def preemptible_vision(kube: KubeOnCluster, tmp_path: Path) -> Preemptible:
    """The preemption tests' set-up (`Preemptible`), made."""
    await gone(kube, "clusterqueue", "vision")  # an earlier test's, deleted without waiting
    quota = KueueQuota(kube, tmp_path, name="vision", preemption={"within_tenant": "LowerPriority"})
    high = f"kq-high-{quota.tag}"
    kube.cluster.apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": high},
                "value": 1000,
            }
        ]
    )
    flavors = {
        quota.flavor: {
            "node_selector": {"gpuaas.jupyter.org/flavor": quota.flavor},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        }
    }
    return Preemptible(kube, quota, high, flavors)


async def field_is_id(url: str, rid: str, test: Any) -> dict[str, Any] | None:
    """The request `rid` (read through the API) when `test` holds."""
    resp = await AsyncHTTPClient().fetch(url + f"api/requests/{rid}", headers=HEADERS)
    found = json.loads(resp.body)
    return found if test(found) else None


async def test_a_holders_request_whose_pod_never_comes_is_cancelled(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """A request submitted through the API in Kueue mode waits for its pod's Workload, in
    words; when no pod labelled with its id reaches Kueue in time, it is cancelled (as a
    lease that expires), and the reason says why."""
    quota = KueueQuota(kube, tmp_path, name="vision")
    gw = await quota.gateway(tmp_path, intent_timeout=3)
    try:
        alice = GatewayClient(gw.url, TOKENS["alice"])
        req = await alice.submit("vision", "kernel", 1, name="a kernel whose pod never came")
        assert req["state"] == "queued"
        waiting = (await alice.get(req["id"]))["waiting_for"]
        assert waiting["message"] == "waiting for its pod to reach Kueue's queue", waiting
        ended = await wait_until(
            lambda: field_is_id(gw.url, req["id"], lambda r: r["state"] == "cancelled"),
            timeout=30,
            what="the intent cancelled",
        )
        assert ended["reason"] == "its pod did not reach Kueue's queue within 3 s"
        logged = [d.event for d in gw.arbiter.store.decisions(req["id"])]
        assert logged == ["submit", "cancel"], logged
    finally:
        await gw.stop_server()
        quota.close()


async def test_a_workload_made_directly_with_a_holders_label_drives_its_request(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """A Workload created as it is, with no Job or pod behind it (as Kueue's own
    performance runner and benchmarks/kueue_side_by_side.py --workloads create them), and
    labelled with a holder's request id by `kueue_labels`, is bound to that request: Kueue
    admits it, the request is admitted with the flavor Kueue chose, and when its Finished
    condition is set (as the runner marks it after its runtime) the request finishes; no
    second request appears for the Workload."""
    from jupyter_gpuaas.kubernetes.pods import kueue_labels

    quota = KueueQuota(kube, tmp_path, name="vision")
    gw = await quota.gateway(tmp_path)
    events: list[dict[str, Any]] = []
    listening = asyncio.get_running_loop().create_task(listen(gw.url, events))
    name = f"direct-{quota.tag}"
    try:
        alice = GatewayClient(gw.url, TOKENS["alice"])
        req = await alice.submit("vision", "job", 1, quota.flavor, name="a workload of its own")
        labels = kueue_labels("vision", user="alice", kind="job", request=req["id"])
        gpu = {"nvidia.com/gpu": "1"}
        pod = {
            "restartPolicy": "Never",
            "nodeSelector": {"gpuaas.jupyter.org/flavor": quota.flavor},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {"name": "main", "image": "python:3.12", "resources": {"requests": gpu}}
            ],
        }
        quota.run(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "queueName": "vision",
                    "podSets": [{"name": "main", "count": 1, "template": {"spec": pod}}],
                },
            }
        )
        admitted_req = await wait_until(
            lambda: field_is_id(gw.url, req["id"], lambda r: r["state"] == "admitted"),
            timeout=60,
            what="the holder's request admitted by Kueue",
        )
        assert admitted_req["grant"]["flavor"] == quota.flavor
        finished = {
            "type": "Finished",
            "status": "True",
            "reason": "ByTest",
            "message": "finished by the test, as Kueue's performance runner finishes one",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        patch = [{"op": "add", "path": "/status/conditions/-", "value": finished}]
        kube.cluster.kubectl(
            "patch", "workloads.kueue.x-k8s.io", name, "-n", kube.namespace,
            "--subresource=status", "--type=json", "-p", json.dumps(patch),
        )  # fmt: skip
        await wait_until(
            lambda: field_is_id(gw.url, req["id"], lambda r: r["state"] == "finished"),
            timeout=60,
            what="the holder's request finished with its Workload",
        )
        await wait_until(
            lambda: [e["event"] for e in events if e.get("id") == req["id"]][-1:] == ["finish"],
            what="the stream's finish",
        )
        assert [e["event"] for e in events if e.get("id") == req["id"]] == [
            "submit",
            "admit",
            "finish",
        ]
        # The Workload drove the holder's request; none of its own was made for it.
        assert [r for n, r in (await requests_of(gw.url)).items() if name in n] == []
    finally:
        listening.cancel()
        await gw.stop_server()
        quota.close()


async def test_a_gpu_server_goes_through_kueue(kube: KubeOnCluster, tmp_path: Path) -> None:
    """The Hub's QueuedKubeSpawner in Kueue mode (`kueue_queue`), its start played as the
    Hub's User.spawn does (the pre-spawn hook, then start()): the request is submitted, the
    server's pod is created at once in the tenant's LocalQueue, labelled with the request's
    id and gated by Kueue; the spawn page's progress says it is queued, with Kueue's reason;
    once a Job outside jupyter-gpuaas goes, Kueue admits the pod, start() adopts it (not a
    second pod), the scheduler binds it; stop() deletes it and the request ends."""
    quota = KueueQuota(kube, tmp_path, name="vision")
    tenant, flavor, node = quota.tenant, quota.flavor, quota.node
    flavors = {
        flavor: {
            "node_selector": {"gpuaas.jupyter.org/flavor": flavor},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        }
    }
    gw = await quota.gateway(tmp_path)
    root = GatewayClient(gw.url, TOKENS["root"])
    spawner = kube_spawner(
        kube.url,
        gw.url,
        namespace=kube.namespace,
        flavors=flavors,
        kueue_queue="{tenant}",
        start_timeout=60,
    )
    spawner.user_options = {"tenant": tenant, "flavor": flavor, "gpus": 1}
    messages: list[str] = []

    async def follow() -> None:
        async for event in spawner.progress():
            messages.append(event.get("message", ""))

    async def spawn() -> Any:
        await spawner.run_pre_spawn_hook()
        return await asyncio.wait_for(spawner.start(), spawner.start_timeout + 5)

    def server_pod() -> dict[str, Any] | None:
        out = kube.cluster.kubectl(
            "get", "pod", "jupyter-alice", "-n", kube.namespace, "-o=json", "--ignore-not-found"
        )
        return json.loads(out) if out.strip() else None

    try:
        quota.run(job("blocker", tenant, seconds=3600))
        blocker = await wait_until(
            lambda: admitted(gw.url, "blocker"), timeout=60, what="the blocker admitted"
        )
        starting = asyncio.ensure_future(spawn())
        following = asyncio.ensure_future(follow())
        await wait_until(lambda: spawner._rid and server_pod(), timeout=60, what="the pod")
        rid = spawner._rid
        pod = server_pod()
        assert pod is not None
        labels = pod["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == tenant
        assert labels["gpuaas.jupyter.org/request"] == rid
        assert {"name": "kueue.x-k8s.io/admission"} in pod["spec"]["schedulingGates"]
        # The preStop hook that holds SIGTERM back during a preemption warning (prestop.py).
        (notebook,) = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
        hook = notebook["lifecycle"]["preStop"]["exec"]["command"]
        assert hook[1:3] == ["-m", "jupyter_gpuaas.kubernetes.prestop"], hook
        queued = await wait_until(
            lambda: field_is_id(
                gw.url,
                rid,
                lambda r: r.get("position") and (r.get("waiting_for") or {}).get("kind") == "quota",
            ),
            timeout=60,
            what="the server's request with Kueue's position and reason",
        )
        assert queued["position"]["tenant"] == 1
        await wait_until(
            lambda: any("quota is in use" in m for m in messages),
            timeout=30,
            what="the spawn page saying why it waits",
        )
        assert not starting.done()

        await root.cancel(blocker["id"])
        await asyncio.wait_for(starting, 120)
        pod = server_pod()
        assert pod is not None and pod["spec"]["nodeName"] == node
        assert pod["metadata"]["labels"]["gpuaas.jupyter.org/request"] == rid  # adopted
        request = await root.get(rid)
        assert request["state"] == "admitted" and request["grant"]["flavor"] == flavor
        names = await requests_of(gw.url)
        assert not any(n.startswith("Pod jupyter-alice") for n in names)  # one request
        await asyncio.wait_for(following, 10)
        await spawner.stop()
        await wait_until(lambda: server_pod() is None, timeout=60, what="the pod gone")
        await wait_until(
            lambda: field_is_id(gw.url, rid, lambda r: r["state"] == "finished"),
            timeout=60,
            what="the server's request finished",
        )
    finally:
        await gw.stop_server()
        kube.cluster.kubectl("delete", "job", "blocker", "-n", kube.namespace, check=False)
        quota.close()


async def test_a_kernel_kueue_preempts_is_warned_then_ends_preempted(
    kube: KubeOnCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4, a Kueue eviction is humane: a GPU kernel of the real `gpuaas-kubernetes`
    provisioner, admitted by Kueue, is preempted by a Job of a higher WorkloadPriorityClass
    from outside jupyter-gpuaas. Kueue deletes the kernel's pod, which keeps its quota
    through its termination grace: the gateway warns first (`preempt_warning`, with the
    time the grace ends and the sentence our holders show after "will be stopped in N
    min: "), and once the pod has stopped the request ends as preempted, in words, and no
    second request appears for the pod's Workload."""
    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    pre = await preemptible_vision(kube, tmp_path)
    quota, flavors = pre.quota, pre.flavors
    tenant, flavor = quota.tenant, quota.flavor
    mine = {"gpuaas-test": kube.namespace}
    kube.add_node(f"kq-cpu-{quota.tag}", mine)
    gw = await quota.gateway(tmp_path)
    root = GatewayClient(gw.url, TOKENS["root"])
    events: list[dict[str, Any]] = []
    listening = asyncio.get_running_loop().create_task(listen(gw.url, events))
    try:
        async with kernel_cluster(kube, gw.url, tmp_path, monkeypatch, flavors, mine) as cl:
            write_spec(tmp_path / "kernels" / "gpu-kueue", 1, flavor, kubernetes=True)
            km = cl.kernel_manager("gpu-kueue", tenant=tenant, kueue_queue="{tenant}")
            await asyncio.wait_for(km.start_kernel(cwd=str(cl.home / "proj")), 120)
            try:
                rid = km.provisioner.record.request_id
                assert (await root.get(rid))["state"] == "admitted"

                pre.take_back()
                ended = await wait_until(
                    lambda: field_is_id(gw.url, rid, lambda r: r["state"] == "preempted"),
                    timeout=90,
                    what="the kernel's request preempted",
                )
                assert (
                    ended["reason"]
                    == f"preempted: a higher-priority request of {tenant} needed its GPU"
                )
                logged = [d.event for d in gw.arbiter.store.decisions(rid)]
                assert logged == ["submit", "admit", "preempt_warning", "preempt"], logged
                # The warning came first, on the stream, with the time the pod's grace ends
                # and who it is for (the urgent Job's request).
                await wait_until(
                    lambda: [e["event"] for e in events if e.get("id") == rid][-1:] == ["preempt"],
                    what="the stream's preempt",
                )
                (warning,) = [
                    e for e in events if e.get("id") == rid and e["event"] == "preempt_warning"
                ]
                told = warning["request"]
                assert told["state"] == "admitted"  # still running, through its grace
                assert told["preempt_at"] == warning["at"]
                assert (
                    told["preempt_reason"] == f"a higher-priority request of {tenant} needs the GPU"
                )
                urgent_request = await wait_until(
                    lambda: admitted(gw.url, "urgent"), timeout=60, what="urgent admitted"
                )
                assert told["preempted_by"] == urgent_request["id"] == warning["by"]
                # One request for the pod: its Workload, going, made none of its own.
                names = await requests_of(gw.url)
                assert not any(n.startswith(f"Pod alice-{km.kernel_id}") for n in names)
                await wait_until(lambda: cl.pod(km) is None, timeout=90, what="the pod gone")
            finally:
                if km.has_kernel:
                    await km.shutdown_kernel(now=True)
    finally:
        listening.cancel()
        await gw.stop_server()
        pre.close()


async def test_a_kernel_kueue_preempts_runs_until_the_time_it_was_told(
    kube: KubeOnCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4, the termination grace is the user's: Kueue evicts by deleting the pod, and
    the kubelet would SIGTERM the kernel at once; the kernel pod's preStop hook (prestop.py,
    run by KwokKubelet as kubelet runs it) holds SIGTERM back while the gateway's warning
    stands, so the kernel's process is still alive after the eviction and gets SIGTERM
    near the warned time (`preempt_at` less the hook's margin), not at the eviction. A
    normal stop (the user shuts the kernel down) is not held: its hook says so and ends."""
    from jupyter_gpuaas.kubernetes.prestop import DEFAULT_MARGIN
    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    pre = await preemptible_vision(kube, tmp_path)
    quota, flavors = pre.quota, pre.flavors
    tenant, flavor = quota.tenant, quota.flavor
    mine = {"gpuaas-test": kube.namespace}
    kube.add_node(f"kq-cpu-{quota.tag}", mine)
    gw = await quota.gateway(tmp_path)
    root = GatewayClient(gw.url, TOKENS["root"])
    try:
        async with kernel_cluster(kube, gw.url, tmp_path, monkeypatch, flavors, mine) as cl:
            write_spec(tmp_path / "kernels" / "gpu-kueue", 1, flavor, kubernetes=True)
            # A normal stop: the kernel shut down by its user.
            km = cl.kernel_manager("gpu-kueue", tenant=tenant, kueue_queue="{tenant}")
            await asyncio.wait_for(km.start_kernel(cwd=str(cl.home / "proj")), 120)
            name = km.provisioner.kernel_pod_name
            lifecycle = cl.kubelet.started[-1]["spec"]["containers"][0]["lifecycle"]
            assert lifecycle["preStop"]["exec"]["command"][1:3] == [
                "-m",
                "jupyter_gpuaas.kubernetes.prestop",
            ]
            await asyncio.wait_for(km.shutdown_kernel(now=True), 60)
            await wait_until(lambda: not cl.kubelet.alive(name), timeout=30, what="stopped")
            stop = cl.kubelet.stops[name]
            said = stop["hook_log"].read_text()
            assert "stopping now" in said and "stopping in" not in said, said
            assert stop["hook_exit"] == 0

            # An eviction: Kueue deletes the pod for a Job of a higher priority.
            km = cl.kernel_manager("gpu-kueue", tenant=tenant, kueue_queue="{tenant}")
            await asyncio.wait_for(km.start_kernel(cwd=str(cl.home / "proj")), 120)
            try:
                rid = km.provisioner.record.request_id
                name = km.provisioner.kernel_pod_name
                assert (await root.get(rid))["state"] == "admitted"
                # KWOK is told to leave the deleted pod to its kubelet (KwokKubelet deletes
                # it once its process is gone), not to remove it at a random time.
                pod = ["pod", name, "-n", kube.namespace]
                kube.cluster.kubectl("annotate", *pod, "pod-delete.stage.kwok.x-k8s.io/delay=1h")
                pre.take_back()
                # The warning, or already the end: a gateway that saw Kueue's eviction only
                # once Kueue had also taken the quota back (a stall of the gateway, a slow
                # watch) records the preemption at once; the pod's grace is the user's either
                # way, since the hook holds SIGTERM back from its start.
                seen: list[dict[str, Any]] = []

                async def warned_or_ended() -> dict[str, Any] | None:
                    seen[:] = [await field_is_id(gw.url, rid, lambda r: True)]
                    r = seen[0]
                    return r if r["preempt_at"] is not None or r["state"] == "preempted" else None

                try:
                    warned = await wait_until(warned_or_ended, timeout=90, what="the warning")
                except AssertionError as e:
                    raise AssertionError(f"{e}; the request read {seen}") from None
                await wait_until(lambda: name in cl.kubelet.stops, timeout=30, what="deleted")
                stop = cl.kubelet.stops[name]
                at = warned["preempt_at"] or stop["deleted_at"] + stop["grace"]
                # The pod is deleted, the warning stands: the kernel still runs.
                assert cl.kubelet.alive(name)
                assert stop["sigterm_at"] is None
                await wait_until(lambda: stop["sigterm_at"] is not None, timeout=60, what="SIGTERM")
                # SIGTERM came at the warned time less the margin, long after the eviction.
                assert stop["sigterm_at"] >= at - DEFAULT_MARGIN - 1.0, (stop, at)
                assert stop["sigterm_at"] - stop["deleted_at"] > 10.0, (stop, at)
                assert stop["hook_exit"] == 0
                assert "stopping in" in stop["hook_log"].read_text()
                ended = await wait_until(
                    lambda: field_is_id(gw.url, rid, lambda r: r["state"] == "preempted"),
                    timeout=90,
                    what="the kernel's request preempted",
                )
                assert ended["reason"].startswith("preempted: ")
                # It ended once the pod was gone (its process stopped, the pod deleted),
                # not when Kueue took the quota back, seconds after the eviction.
                (end,) = [d for d in gw.arbiter.store.decisions(rid) if d.event == "preempt"]
                assert stop["removing_at"] is not None and end.t >= stop["removing_at"], (
                    end.t,
                    stop,
                )
            finally:
                if km.has_kernel:
                    await km.shutdown_kernel(now=True)
    finally:
        await gw.stop_server()
        pre.close()


async def test_an_idle_holder_is_culled_and_its_workload_finishes(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """Item 3, culling under Kueue: a holder's GPU kernel (its request submitted through
    the API, its pod labelled with the request's id, as the provisioner makes it),
    admitted by Kueue, says it is idle; after its tenant's `idle_timeout` the gateway warns
    and then culls it (our idle clock on top of Kueue, which has none): the request is
    culled, in words,
    its pod deleted, and Kueue finishes its Workload, so the quota is free at once (Kueue
    keeps no reservation without a pod: nothing is parked)."""
    await gone(kube, "clusterqueue", "vision")  # an earlier test's, deleted without waiting
    quota = KueueQuota(kube, tmp_path, name="vision", idle_timeout=3)
    quota.quotas["policy"]["cull_warning"] = 1  # the gateway's own: warned 1 s before
    tenant, flavor, tag = quota.tenant, quota.flavor, quota.tag
    gw = await quota.gateway(tmp_path)
    try:
        alice = GatewayClient(gw.url, TOKENS["alice"])
        req = await alice.submit(tenant, "kernel", 1, name="an idle kernel")
        rid = req["id"]
        pod = kernel_pod_manifest(
            name=f"kernel-{tag}",
            kernel_id=tag,
            user="alice",
            command=["python", "-m", "ipykernel_launcher"],
            image="quay.io/jupyter/pytorch-notebook",
            request={"id": rid, "gpus": 1, "tenant": tenant, "flavor": flavor, "grant": None},
            flavors={flavor: {"node_selector": {"gpuaas.jupyter.org/flavor": flavor}}},
            queue=tenant,
        )
        pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        quota.run(pod)
        await wait_until(
            lambda: field_is_id(gw.url, rid, lambda r: r["state"] == "admitted"),
            timeout=60,
            what="the kernel admitted by Kueue",
        )
        await alice.heartbeat(rid, busy=False)
        culled = await wait_until(
            lambda: field_is_id(gw.url, rid, lambda r: r["state"] == "culled"),
            timeout=60,
            what="the idle kernel culled",
        )
        assert culled["reason"] == "culled: idle on its GPU for 3 s"
        assert "parked" not in culled and culled["grant"] is None
        logged = [d.event for d in gw.arbiter.store.decisions(rid)]
        assert logged == ["submit", "admit", "cull_warning", "cull"], logged

        def pod_and_workloads() -> str:
            ns = kube.namespace
            pods = kube.cluster.kubectl("get", "pods", "-n", ns, "-o", "name").split()
            workloads = kube.cluster.kubectl("get", "workloads", "-n", ns, "-o", "name").split()
            return " ".join([p for p in pods if p == f"pod/kernel-{tag}"] + workloads)

        # The pod goes, and with it its Workload (Kueue's pod integration owns it by
        # the pod): the tenant's quota is free.
        await wait_until(lambda: pod_and_workloads() == "", timeout=60, what="pod, Workload gone")
        assert (await alice.get(rid))["state"] == "culled"  # no later end overwrote it
        quota.run(job("next", tenant, seconds=3600))
        await wait_until(lambda: admitted(gw.url, "next"), timeout=60, what="the quota free")
    finally:
        await gw.stop_server()
        kube.cluster.kubectl("delete", "job", "next", "-n", kube.namespace, check=False)
        quota.close()


async def test_a_gpu_server_kueue_preempts_is_warned_held_then_ends_preempted(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """Item 4 for a server: the Hub's QueuedKubeSpawner in Kueue mode, its server pod
    admitted by Kueue, is preempted by a Job of a higher WorkloadPriorityClass from outside
    jupyter-gpuaas: the spawner hears the warning and words it for the user ("your server
    will be stopped in …: a higher-priority request of vision needs the GPU"). KwokKubelet
    plays the pod's stop (a stand-in for jupyterhub-singleuser, which needs a Hub, with the
    pod's env): its preStop hook holds SIGTERM back through the grace, although Kueue
    takes the quota back seconds after the eviction, and the request ends as preempted
    only once the pod is gone."""
    from kwok_kubelet import UNTIL_SIGTERM, KwokKubelet

    pre = await preemptible_vision(kube, tmp_path)
    quota, tenant = pre.quota, pre.quota.tenant
    gw = await quota.gateway(tmp_path)
    spawner = pre.server_spawner(
        gw.url,
        # Where the server (and its preStop hook) finds the gateway with no Hub's proxy
        # (c.Spawner.environment, as hub/gateway_url.py says); alice's token for the Hub's.
        environment={"GPUAAS_URL": gw.url, "GPUAAS_TOKEN": TOKENS["alice"]},
    )
    kubelet = KwokKubelet(
        kube.cluster.kubeconfig,
        kube.namespace,
        "component=singleuser-server",
        tmp_path,
        stand_in=UNTIL_SIGTERM,
    )
    await kubelet.start()
    name = "jupyter-alice"
    try:
        await spawner.run_pre_spawn_hook()
        await asyncio.wait_for(spawner.start(), spawner.start_timeout + 5)
        rid = spawner._rid
        assert (await GatewayClient(gw.url, TOKENS["root"]).get(rid))["state"] == "admitted"
        await wait_until(lambda: kubelet.alive(name), timeout=60, what="the server played")
        # KWOK leaves the deleted pod to its kubelet (KwokKubelet deletes it once its
        # process is gone), not to remove it at a time of its own.
        pod = ["pod", name, "-n", kube.namespace]
        kube.cluster.kubectl("annotate", *pod, "pod-delete.stage.kwok.x-k8s.io/delay=1h")

        pre.take_back()
        warned = await wait_until(
            lambda: spawner._preempt_warning, timeout=90, what="the spawner warned"
        )
        assert warned["rid"] == rid and warned["at"]
        assert warned["why"] == f"a higher-priority request of {tenant} needs the GPU"
        await wait_until(lambda: name in kubelet.stops, timeout=30, what="the pod deleted")
        stop = kubelet.stops[name]
        await wait_until(lambda: stop["sigterm_at"] is not None, timeout=60, what="SIGTERM")
        # Held by the hook through the grace, long past Kueue's release of the quota.
        assert stop["sigterm_at"] - stop["deleted_at"] > 10.0, stop
        assert stop["hook_exit"] == 0
        assert "stopping in" in stop["hook_log"].read_text()
        ended = await wait_until(
            lambda: field_is_id(gw.url, rid, lambda r: r["state"] == "preempted"),
            timeout=60,
            what="the server's request preempted",
        )
        assert ended["reason"] == f"preempted: a higher-priority request of {tenant} needed its GPU"
        decisions = gw.arbiter.store.decisions(rid)
        logged = [d.event for d in decisions]
        assert logged == ["submit", "admit", "preempt_warning", "preempt"], logged
        # It ended once the pod was gone, not when Kueue took the quota back.
        assert stop["removing_at"] is not None and decisions[-1].t >= stop["removing_at"], (
            decisions[-1].t,
            stop,
        )
    finally:
        await kubelet.close()
        with contextlib.suppress(Exception):
            await spawner.stop()
        await gw.stop_server()
        pre.close()


async def test_a_holder_that_gives_back_a_preempted_grant_ends_it_preempted(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """A holder whose pod Kueue preempted gives its grant back while the pod goes (the
    kernel provisioner sees its pod deleted and releases, often before the gateway's pods
    loop sees it gone; a user may stop early in the grace): the request ends as preempted,
    with the reason in words, not as finished. The server's pod is held on its way out
    (KWOK's delete delay, KwokKubelet not started), so the release comes first for sure."""
    pre = await preemptible_vision(kube, tmp_path)
    quota, tenant = pre.quota, pre.quota.tenant
    gw = await quota.gateway(tmp_path)
    spawner = pre.server_spawner(gw.url)
    name = "jupyter-alice"
    try:
        await spawner.run_pre_spawn_hook()
        await asyncio.wait_for(spawner.start(), spawner.start_timeout + 5)
        rid = spawner._rid
        pod = ["pod", name, "-n", kube.namespace]
        kube.cluster.kubectl("annotate", *pod, "pod-delete.stage.kwok.x-k8s.io/delay=1h")
        pre.take_back()
        await wait_until(lambda: spawner._preempt_warning, timeout=90, what="the warning")
        assert (await GatewayClient(gw.url, TOKENS["root"]).get(rid))["state"] == "admitted"
        # The holder gives the grant back while its pod is still on its way out.
        await GatewayClient(gw.url, TOKENS["alice"]).cancel(rid)
        ended = await GatewayClient(gw.url, TOKENS["root"]).get(rid)
        assert ended["state"] == "preempted", ended
        assert ended["reason"] == f"preempted: a higher-priority request of {tenant} needed its GPU"
        logged = [d.event for d in gw.arbiter.store.decisions(rid)]
        assert logged == ["submit", "admit", "preempt_warning", "preempt"], logged
    finally:
        kube.cluster.kubectl(
            "delete", "pod", name, "-n", kube.namespace, "--grace-period=0", "--force", check=False
        )
        with contextlib.suppress(Exception):
            await spawner.stop()
        await gw.stop_server()
        pre.close()


async def test_a_queued_workloads_wait_is_the_forward_run_from_kueues_state(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """Issue 43 item 1 in Kueue mode: a queued request's `estimated_wait` is the forward
    run of our core started from Kueue's state (admission/from_kueue.py), not waits.py's
    guess. The store holds past grants (tests/history_sample.py: six jobs held 4 h each,
    ended in the last hour), so a Job is expected to hold its GPU about 4 h: with the
    tenant's one GPU taken and two Jobs made with kubectl waiting, the one behind waits
    for two holds (more than 6 h), and once the holder ahead is deleted and Kueue admits
    the next, for one (at most 4 h)."""
    from history_sample import write_past_jobs

    hour = 3600.0
    quota = KueueQuota(kube, tmp_path)
    db_url = f"sqlite:///{tmp_path / 'gpuaas.sqlite'}"
    write_past_jobs(db_url, held=4 * hour)
    gw = await quota.gateway(tmp_path, db_url)
    names = ("ahead", "behind")
    try:
        quota.run(job("holder", quota.tenant, seconds=3600))
        await wait_until(lambda: admitted(gw.url, "holder"), timeout=60, what="holder admitted")
        quota.run(*(job(n, quota.tenant, seconds=3600) for n in names))

        async def queued_second() -> dict[str, Any] | None:
            """The request Kueue's visibility API places second in the queue."""
            for n in names:
                found = await field_is(
                    gw.url, n, lambda r: (r["position"] or {}).get("overall") == 2
                )
                if found is not None:
                    return found
            return None

        last = await wait_until(queued_second, timeout=60, what="a Job second in Kueue's queue")
        rid = last["id"]
        first = next(n for n in names if not last["name"].startswith(f"Job {n} ("))

        async def estimate(test: Any, what: str) -> dict[str, Any]:
            """`rid`'s forward-run estimate once `test` holds of it (what was read last,
            on a timeout)."""
            seen: list[Any] = []

            def holds(r: dict[str, Any]) -> bool:
                seen[:] = [r["state"], r["position"], r["estimated_wait"]]
                wait = r["estimated_wait"] or {}
                return r["state"] == "queued" and wait.get("seconds") is not None and test(wait)

            try:
                found = await wait_until(lambda: field_is_id(gw.url, rid, holds), timeout=60)
            except AssertionError:
                raise AssertionError(f"timed out waiting for {what}; last read: {seen}") from None
            wait: dict[str, Any] = found["estimated_wait"]
            assert wait["basis"].startswith("from running the queue forward: "), wait
            return wait

        # The holder's 4 h, then the next one's.
        before = await estimate(lambda w: w["seconds"] > 6 * hour, "an estimate of two holds")
        assert "1 grant held about as long as 6 past grants were" in before["basis"], before

        # The holder deleted: Kueue admits the one ahead; the one behind waits one hold.
        kube.cluster.kubectl("delete", "job", "holder", "-n", kube.namespace, "--wait=false")
        await wait_until(lambda: admitted(gw.url, first), timeout=60, what=f"{first} admitted")
        await estimate(lambda w: w["seconds"] <= 4 * hour, "an estimate of one hold")
    finally:
        await gw.stop_server()
        for n in ("holder", *names):
            kube.cluster.kubectl(
                "delete", "job", n, "-n", kube.namespace, "--wait=false", check=False
            )
        quota.close()
