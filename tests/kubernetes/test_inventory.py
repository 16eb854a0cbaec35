"""The cluster inventory (`--devices kubernetes`): the pure Node mapping by dict equality,
then the real gateway following the Nodes of the REAL API server of the session's cluster:
KWOK Nodes that join are placed on, a Node that turns NotReady releases its grants, the
watch resumes from its resourceVersion after a lost connection and lists again on 410 Gone
after etcd compacted its version; and the gateway command on the same API server."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from gwutil import launch_gateway
from helpers import wait_until
from kubefix import TOKEN_FILE, TOKENS
from kubeutil import KubeOnCluster, start_gateway
from tornado.httpclient import AsyncHTTPClient
from traitlets.config import Config

from jupyter_gpuaas.client import GatewayClient, GatewayError
from jupyter_gpuaas.kubeapi.nodes import ClusterNode, NodeChange, diff, node_view

FLAVORS = {
    "a100": {"node_selector": {"pool": "a100"}, "resource": "nvidia.com/gpu"},
    "mig": {"node_selector": {"pool": "mig"}, "resource": "nvidia.com/mig-1g.10gb"},
}


def node(name: str, labels: dict[str, str], alloc: dict[str, str], **kw: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": kw.get("cordoned", False), "taints": kw.get("taints", [])},
        "status": {
            "allocatable": alloc,
            "conditions": [
                {"type": "Ready", "status": "True" if kw.get("ready", True) else "False"}
            ],
        },
    }


def test_node_view() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule", "timeAdded": "x"}
    labels = {
        "pool": "a100",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
    }
    got = node_view(
        node("g1", labels, {"nvidia.com/gpu": "8", "cpu": "64"}, taints=[taint]), FLAVORS
    )
    assert got == (
        ClusterNode(
            name="g1",
            flavor="a100",
            gpus=8,
            model="NVIDIA-A100-SXM4-80GB",
            memory_mib=81920,
            taints=({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},),
        ),
        "",
    )
    mig = node("m1", {"pool": "mig"}, {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7"})
    assert node_view(mig, FLAVORS) == (ClusterNode("m1", "mig", 7), "")
    assert node_view(node("c", {}, {"cpu": "8"}), FLAVORS) == (None, "no flavor's labels")
    assert node_view(
        node("g", {"pool": "a100"}, {"nvidia.com/gpu": "8"}, ready=False), FLAVORS
    ) == (
        None,
        "NotReady",
    )
    not_yet = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    assert node_view(
        node("g", {"pool": "a100"}, {"nvidia.com/gpu": "8"}, taints=[not_yet]), FLAVORS
    ) == (None, "NotReady (tainted node.kubernetes.io/not-ready)")
    cordoned = node("g", {"pool": "a100"}, {"nvidia.com/gpu": "8"}, cordoned=True)
    assert node_view(cordoned, FLAVORS) == (None, "cordoned (unschedulable)")
    assert node_view(node("g", {"pool": "a100"}, {"nvidia.com/gpu": "0"}), FLAVORS) == (
        None,
        "no allocatable nvidia.com/gpu",
    )


def test_diff_leaves_then_joins() -> None:
    a, b = ClusterNode("a", "a100", 8), ClusterNode("b", "a100", 8)
    b4 = ClusterNode("b", "a100", 4)
    assert diff({"a": a, "b": b}, {"b": b4, "c": a}, {"a": "deleted"}) == [
        NodeChange("leave", "a", reason="deleted"),
        NodeChange("leave", "b", reason="gone"),
        NodeChange("join", "b", node=b4),
        NodeChange("join", "c", node=a),
    ]


QUOTAS = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
    "tenants": {"vision": {"quota": {"a100": 8}}},
    "policy": {
        "idle_timeout": 0,
        "reservation_ttl": 0,
        "autoscale": {"a100": {"max_nodes": 4, "provision": False}},
    },
}


class CuttableLink:
    """A TCP forwarder on loopback between the gateway and the API server, which the test
    cuts and restores: a lost connection is a fault the real API server cannot make on
    cue (TLS passes through untouched; the server's certificate names 127.0.0.1)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.down = False
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self._open |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()
                self._open.discard(dst)

        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass  # close(): the test is over
        finally:
            self._tasks.discard(task)

    def cut(self) -> None:
        """Every open connection closed, new ones refused, until `restore`."""
        self.down = True
        for w in list(self._open):
            w.close()
        self._open.clear()

    def restore(self) -> None:
        self.down = False

    async def close(self) -> None:
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def etcd_compact(kube: KubeOnCluster) -> int:
    """Compact the cluster's etcd at its current revision through etcd's own API (its
    gRPC gateway on the client port kwokctl was given): every older revision is gone, as
    the API server's own compaction every 5 minutes makes it. Returns the revision."""
    import base64
    import json
    import urllib.request

    (conf, _) = yaml.safe_load_all((kube.cluster.root / "kwokctl.yaml").read_text())
    base = f"http://127.0.0.1:{conf['options']['etcdPort']}/v3/kv/"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    key = base64.b64encode(b"/registry/nodes/").decode()
    revision = int(post("range", {"key": key, "limit": 1})["header"]["revision"])
    post("compaction", {"revision": revision, "physical": True})
    return revision


def unmanaged_node(kube: KubeOnCluster, name: str, labels: dict[str, str], ready: bool) -> None:
    """A Node no KWOK plays (no kwok annotation): its Ready condition is what the test
    patches into its status, as a kubelet reports it (KWOK would set its own nodes Ready
    again)."""
    import json
    from datetime import datetime, timezone

    from gpuaas_cluster import kwok_node

    if name not in kube._nodes:
        node = kwok_node(name, labels, {"nvidia.com/gpu": "2"}, [])
        del node["metadata"]["annotations"]["kwok.x-k8s.io/node"]
        kube._nodes.append(name)
        kube.cluster.apply([node])
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady",
                "message": "set by the test",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ]
    }
    kube.cluster.kubectl(
        "patch", "node", name, "--subresource=status", "-p", json.dumps({"status": status})
    )


@pytest_asyncio.fixture
async def cluster_gateway(
    kube: KubeOnCluster, tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Any]:
    """The real gateway on the REAL cluster's Nodes of this test (label `gpuaas-test`:
    the inventory's label selector, so the cluster's other Nodes stay out), reaching the
    API server through a CuttableLink (`gw.link`), on each store. Nodes: <ns>-a100-0 (an
    a100 no KWOK plays, Ready) and <ns>-cpu-0 (a KWOK Node of no flavor)."""
    ns = kube.namespace
    mine = {"gpuaas-test": ns}
    unmanaged_node(kube, f"{ns}-a100-0", {"pool": "a100", **mine}, ready=True)
    kube.add_node(f"{ns}-cpu-0", labels={"pool": "cpu", **mine})
    config = yaml.safe_load(kube.cluster.kubeconfig.read_text())
    server = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
    link = CuttableLink(server.hostname or "127.0.0.1", server.port or 443)
    port = await link.start()
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    linked = tmp_path / "kubeconfig-linked"
    linked.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(linked))
    from kubernetes_asyncio.config import kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(linked))
    flavors = {
        name: {**f, "node_selector": {**f["node_selector"], **mine}} for name, f in FLAVORS.items()
    }
    inventory = {"flavors": flavors, "label_selector": f"gpuaas-test={ns}"}
    app = await start_gateway(
        tmp_path,
        quotas=QUOTAS,
        devices="kubernetes",
        config=Config({"ClusterInventory": inventory}),
        db_url=db_url,
    )
    app.link = link
    try:
        yield app
    finally:
        await app.stop_server()
        await link.close()


@pytest.mark.asyncio
async def test_nodes_join_and_leave_the_gateway(kube: KubeOnCluster, cluster_gateway: Any) -> None:
    """On the REAL API server: a KWOK Node that joins is placed on, a Node that turns
    NotReady releases its grants."""
    gw, ns = cluster_gateway, kube.namespace
    a0, a1 = f"{ns}-a100-0", f"{ns}-a100-1"
    alice = GatewayClient(gw.url, TOKENS["alice"])
    bob = GatewayClient(gw.url, TOKENS["bob"])
    devices = await alice.devices()
    assert devices["simulated"] is False
    assert [(n["name"], n["flavor"], n["gpus"]) for n in devices["nodes"]] == [(a0, "a100", 2)]

    first = await alice.submit("vision", "server", 2, flavor="a100")
    assert first["state"] == "admitted" and first["grant"]["node"] == a0
    second = await bob.submit("vision", "server", 2, flavor="a100")
    assert second["state"] == "queued"

    # Quota admits it, capacity does not: the gateway asks for one more a100 node.
    async def wants_two() -> bool:
        # A scrape needs the view scope (root is admin): metrics are not public by default.
        headers = {"Authorization": f"token {TOKENS['root']}"}
        resp = await AsyncHTTPClient().fetch(gw.url + "metrics", headers=headers)
        text = resp.body.decode()
        return 'gpuaas_desired_nodes{flavor="a100"} 2.0' in text and (
            'gpuaas_nodes{flavor="a100"} 1.0' in text
        )

    await wait_until(wants_two)

    # A KWOK Node joins (what a scale-up ends in): the queued request is placed on it.
    kube.add_node(
        a1, labels={"pool": "a100", "gpuaas-test": ns}, allocatable={"nvidia.com/gpu": "2"}
    )

    async def second_admitted() -> Any:
        req = await bob.get(second["id"])
        return req if req["state"] == "admitted" else None

    placed = await wait_until(second_admitted, timeout=60)
    assert placed["grant"]["node"] == a1

    # a100-0 turns NotReady: its holder is told, its grant released.
    unmanaged_node(kube, a0, {}, ready=False)

    async def first_ended() -> Any:
        req = await alice.get(first["id"])
        return req if req["state"] not in ("admitted", "queued") else None

    ended = await wait_until(first_ended, timeout=60)
    assert ended["state"] == "finished"
    assert a0 in ended.get("reason", ""), ended
    assert [n["name"] for n in (await alice.devices())["nodes"]] == [a1]
    assert (await bob.get(second["id"]))["state"] == "admitted"  # other nodes untouched


@pytest.mark.asyncio
async def test_grant_info_charges_the_pods_gpus_to_their_tenant(
    kube: KubeOnCluster, cluster_gateway: Any
) -> None:
    """On the REAL API server's Nodes: the gateway cannot know which GPUs of the Node the
    device plugin gave the pod, so there is no grant_info until the holder reports the
    UUIDs its container sees; then one series per whole GPU, `Hostname` the grant's Node
    (dcgm-exporter's label), the tenant, and no user without --metrics-user-label. A
    MIG instance's UUID is not dcgm-exporter's and is left out; bad UUIDs are a 400."""
    gw, ns = cluster_gateway, kube.namespace
    alice = GatewayClient(gw.url, TOKENS["alice"])
    req = await alice.submit("vision", "server", 2, flavor="a100")
    assert req["state"] == "admitted" and req["grant"]["node"] == f"{ns}-a100-0"
    assert req["grant"]["uuids"] is None  # the Node's GPUs have no UUID the gateway knows

    async def grant_info() -> list[str]:
        headers = {"Authorization": f"token {TOKENS['root']}"}
        resp = await AsyncHTTPClient().fetch(gw.url + "metrics", headers=headers)
        return [
            line
            for line in resp.body.decode().splitlines()
            if line.startswith("gpuaas_grant_info{")
        ]

    assert await grant_info() == []
    gpus = ["GPU-0b6c39b8-6d24-4a6f-9f65-2a1de1b1c0a1", "GPU-7d0e0f19-1c2b-4f3e-8d4c-5b6a79880e12"]
    await alice.heartbeat(req["id"], True, 0.5, uuids=gpus)
    lines = await grant_info()
    assert sorted(lines) == sorted(
        f'gpuaas_grant_info{{GPU_I_PROFILE="",Hostname="{ns}-a100-0",UUID="{u}",'
        f'flavor="a100",tenant="vision",user=""}} 1.0'
        for u in gpus
    )
    await alice.heartbeat(req["id"], True, uuids=["MIG-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"])
    assert await grant_info() == []
    with pytest.raises(GatewayError) as bad:
        await alice.heartbeat(req["id"], True, uuids=["0", "1"])
    assert bad.value.status == 400 and "uuids" in str(bad.value)
    await alice.cancel(req["id"])
    assert await grant_info() == []


@pytest.mark.asyncio
async def test_the_watch_resumes_and_relists_on_410(
    kube: KubeOnCluster, cluster_gateway: Any
) -> None:
    """On the REAL API server (node watches served from etcd: scripts/cluster.py turns the
    watch cache off for Nodes) and its etcd: a lost connection (the CuttableLink) resumes
    the watch from its resourceVersion, no new list; a resume after etcd compacted that
    version gets 410 Gone, and the gateway lists again and sees the Node deleted
    meanwhile gone."""
    gw, ns = cluster_gateway, kube.namespace
    a0, a1 = f"{ns}-a100-0", f"{ns}-a100-1"
    alice = GatewayClient(gw.url, TOKENS["alice"])
    source = gw.inventory._source

    async def names() -> list[str]:
        return sorted(n["name"] for n in (await alice.devices())["nodes"])

    async def has(expected: list[str]) -> bool:
        return await names() == expected

    await wait_until(lambda: has([a0]))
    # A lost connection: the watch comes back from its resourceVersion, no new list.
    gw.link.cut()
    gw.link.restore()
    kube.add_node(
        a1, labels={"pool": "a100", "gpuaas-test": ns}, allocatable={"nvidia.com/gpu": "2"}
    )
    await wait_until(lambda: has([a0, a1]), timeout=60)
    assert source.relists == 0

    # The history is compacted while the watch is away, and the job's Node is deleted
    # meanwhile: the resume gets 410 Gone, the gateway lists again and sees it gone.
    held = await alice.submit("vision", "job", 2, flavor="a100")
    assert held["state"] == "admitted"
    gone = held["grant"]["node"]
    gw.link.cut()
    kube.cluster.kubectl("delete", "node", gone)
    # More writes after the delete, so that the watch's next revision is compacted too.
    for i in range(2):
        kube.cluster.kubectl("create", "configmap", f"tick-{i}", "-n", ns)
    etcd_compact(kube)
    gw.link.restore()
    stay = a1 if gone == a0 else a0
    await wait_until(lambda: has([stay]), timeout=60)
    assert source.relists == 1

    # The job on it is requeued (as a preempted job), and placed on the node that stays.
    async def held_moved() -> Any:
        req = await alice.get(held["id"])
        moved = req["state"] == "admitted" and req["grant"]["node"] == stay
        return req if moved else None

    await wait_until(held_moved, timeout=60)


@pytest.mark.asyncio
async def test_the_gateway_command_with_the_manifests_config(
    kube: KubeOnCluster, tmp_path: Path
) -> None:
    """`jupyter-gpuaas gateway --devices=kubernetes --config=gpuaas_config.json`, the config
    being the one `kubernetes manifests` puts in its ConfigMap, as a real process talking
    to the session's REAL API server (its kubeconfig, a client certificate) over HTTPS: it
    lists the KWOK GPU Node this test adds (its flavor's selector names this test's label,
    so the cluster's other a100 Nodes stay out)."""
    import contextlib
    import io
    import os

    from jupyter_gpuaas.cli import main

    mine = {"pool": "a100", "gpuaas-test": kube.namespace}
    kube.add_node("gpu-a", labels=mine, allocatable={"nvidia.com/gpu": "2"})
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(yaml.safe_dump(QUOTAS))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert (
            main(
                [
                    "kubernetes",
                    "manifests",
                    "--quotas",
                    str(quotas),
                    "--flavor-selector",
                    "a100=" + ",".join(f"{k}={v}" for k, v in mine.items()),
                ]
            )
            == 0
        )
    (cm,) = [
        d
        for d in yaml.safe_load_all(buf.getvalue())
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "jupyter-gpuaas"
    ]
    config = tmp_path / "gpuaas_config.json"
    config.write_text(cm["data"]["gpuaas_config.json"])
    # Not waited for here: `listed` below waits on the event loop, for the cluster's node.
    gp = launch_gateway(
        tmp_path, f"sqlite:///{tmp_path / 'g.sqlite'}", f"--config={config}", quotas=QUOTAS,
        tokens=TOKEN_FILE, devices="kubernetes", env=os.environ, wait=False,
    )  # fmt: skip
    try:
        client = GatewayClient(gp.url, TOKENS["alice"])

        async def listed() -> Any:
            if gp.proc.poll() is not None:
                raise AssertionError(gp.tail())
            try:
                return (await client.devices())["nodes"]
            except Exception:
                return None

        (only,) = await wait_until(listed, timeout=60)
        assert (only["name"], only["flavor"], only["gpus"], only["free"]) == ("gpu-a", "a100", 2, 2)
    finally:
        gp.stop()
