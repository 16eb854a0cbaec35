"""The cluster inventory (`--devices kubernetes`): the pure Node mapping by dict equality,
then the real gateway following the Nodes of the Kubernetes API DOUBLE (k8s_double.py)
over real HTTP: nodes that join are placed on, a Node that turns NotReady releases its
grants, the watch resumes from its resourceVersion after a disconnect and lists again on
410 Gone (these still on the double: their move to the real control plane is issue 39's
next step); and the gateway command on the REAL API server of the session's cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from helpers import wait_until
from k8s_double import KubernetesDouble
from kubefix import TOKEN_FILE, TOKENS
from kubeutil import KubeOnCluster
from tornado.httpclient import AsyncHTTPClient

from jupyter_gpuaas.client import GatewayClient
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


def a100(k8s: KubernetesDouble, name: str) -> None:
    k8s.add_node(name, labels={"pool": "a100"}, allocatable={"nvidia.com/gpu": "2"})


@pytest_asyncio.fixture
async def cluster_gateway(k8s: KubernetesDouble, make_cluster_gateway: Any, db_url: str) -> Any:
    """The gateway on the double's Nodes (a100-0, and cpu-0 of no flavor), on each store."""
    a100(k8s, "a100-0")
    k8s.add_node("cpu-0", labels={"pool": "cpu"})
    return await make_cluster_gateway(flavors=FLAVORS, quotas=QUOTAS, db_url=db_url)


@pytest.mark.asyncio
async def test_nodes_join_and_leave_the_gateway(
    k8s: KubernetesDouble, cluster_gateway: Any
) -> None:
    gw = cluster_gateway
    alice = GatewayClient(gw.url, TOKENS["alice"])
    bob = GatewayClient(gw.url, TOKENS["bob"])
    devices = await alice.devices()
    assert devices["simulated"] is False
    assert [(n["name"], n["flavor"], n["gpus"]) for n in devices["nodes"]] == [
        ("a100-0", "a100", 2)
    ]

    first = await alice.submit("vision", "server", 2, flavor="a100")
    assert first["state"] == "admitted" and first["grant"]["node"] == "a100-0"
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

    # A node joins (what a scale-up ends in): the queued request is placed on it.
    a100(k8s, "a100-1")

    async def second_admitted() -> Any:
        req = await bob.get(second["id"])
        return req if req["state"] == "admitted" else None

    placed = await wait_until(second_admitted)
    assert placed["grant"]["node"] == "a100-1"

    # a100-0 turns NotReady: its holder is told, its grant released.
    k8s.set_node_ready("a100-0", False)

    async def first_ended() -> Any:
        req = await alice.get(first["id"])
        return req if req["state"] not in ("admitted", "queued") else None

    ended = await wait_until(first_ended)
    assert ended["state"] == "finished"
    assert "a100-0" in ended.get("reason", ""), ended
    assert [n["name"] for n in (await alice.devices())["nodes"]] == ["a100-1"]
    assert (await bob.get(second["id"]))["state"] == "admitted"  # other nodes untouched


@pytest.mark.asyncio
async def test_the_watch_resumes_and_relists_on_410(
    k8s: KubernetesDouble, cluster_gateway: Any
) -> None:
    gw = cluster_gateway
    alice = GatewayClient(gw.url, TOKENS["alice"])
    source = gw.inventory._source

    async def names() -> list[str]:
        return sorted(n["name"] for n in (await alice.devices())["nodes"])

    async def has(expected: list[str]) -> bool:
        return await names() == expected

    await wait_until(lambda: _true_when(k8s.watchers))  # the gateway is watching
    lists_before = _node_lists(k8s)
    # A lost connection: the watch comes back from its resourceVersion, no new list.
    k8s.drop_watches()
    a100(k8s, "a100-1")
    await wait_until(lambda: has(["a100-0", "a100-1"]))
    assert _node_lists(k8s) == lists_before and source.relists == 0
    watches = [p for m, p in k8s.requests if p.startswith("/api/v1/nodes") and "watch=True" in p]
    assert len(watches) >= 2
    assert all("resourceVersion=&" not in p for p in watches)  # always from a version

    # The history is compacted while the watch is away, and a100-0 is deleted meanwhile:
    # the resume gets 410 Gone, the gateway lists again and sees the node gone.
    held = await alice.submit("vision", "job", 2, flavor="a100")
    assert held["state"] == "admitted"
    gone = held["grant"]["node"]
    await wait_until(lambda: _true_when(k8s.watchers))
    k8s.compact()
    k8s.drop_watches()
    k8s.delete("/api/v1", "nodes", gone)
    stay = "a100-1" if gone == "a100-0" else "a100-0"
    await wait_until(lambda: has([stay]))
    assert source.relists == 1
    assert _node_lists(k8s) == lists_before + 1

    # The job on it is requeued (as a preempted job), and placed on the node that stays.
    async def held_moved() -> Any:
        req = await alice.get(held["id"])
        moved = req["state"] == "admitted" and req["grant"]["node"] == stay
        return req if moved else None

    await wait_until(held_moved)


async def _true_when(value: Any) -> bool:
    return bool(value)


def _node_lists(k8s: KubernetesDouble) -> int:
    return sum(
        1 for m, p in k8s.requests if p.startswith("/api/v1/nodes") and "watch=True" not in p
    )


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
    import socket
    import sys

    from jupyter_gpuaas.cli import main

    mine = {"pool": "a100", "gpuaas-test": kube.namespace}
    kube.add_node("gpu-a", labels=mine, allocatable={"nvidia.com/gpu": "2"})
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(yaml.safe_dump(QUOTAS))
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKEN_FILE))
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "gateway.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jupyter_gpuaas.gateway.app",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--quotas={quotas}",
        f"--tokens={tokens}",
        "--devices=kubernetes",
        f"--config={config}",
        f"--db-url=sqlite:///{tmp_path / 'g.sqlite'}",
        stdout=log.open("wb"),
        stderr=asyncio.subprocess.STDOUT,
        env=dict(os.environ),
    )
    try:
        client = GatewayClient(f"http://127.0.0.1:{port}/", TOKENS["alice"])

        async def listed() -> Any:
            if proc.returncode is not None:
                raise AssertionError(log.read_text())
            try:
                return (await client.devices())["nodes"]
            except Exception:
                return None

        (only,) = await wait_until(listed, timeout=60)
        assert (only["name"], only["flavor"], only["gpus"], only["free"]) == ("gpu-a", "a100", 2, 2)
    finally:
        proc.terminate()
        await proc.wait()
