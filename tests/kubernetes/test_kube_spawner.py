"""The real QueuedKubeSpawner (KubeSpawner subclass) on the REAL control plane of the
session (conftest.py's `cluster`: kube-apiserver, the scheduler, KWOK's nodes) and the
real gateway, both over real HTTP.

The real scheduler binds the pods to the KWOK Nodes each test adds (named as the gateway's
simulated inventory names its nodes) by node selector, required affinity, taints and
allocatable GPUs; KWOK plays their kubelet (the pods are Running and Ready with a loopback
IP, but no process listens there: these tests do not talk to the server). The Hub's part
(User.spawn) is played by the tests calling start()/progress()/stop() as the Hub does.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
from typing import Any

import pytest
from helpers import wait_until
from kubefix import TOKENS
from kubeutil import GPU_TAINT, KubeOnCluster

from jupyter_gpuaas.client import GatewayClient

pytestmark = pytest.mark.asyncio

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "team": "ml"}


def cluster(kube: KubeOnCluster) -> None:
    """KWOK Nodes named as the gateway's (simulated) inventory names them."""
    kube.add_node("a100-0", A100, {"nvidia.com/gpu": "2"}, GPU_TAINT)
    kube.add_node("cpu-0", {"team": "ml"})


def created_pod(kube: KubeOnCluster, name: str = "jupyter-alice") -> dict[str, Any]:
    pods = [p for p in kube.pods() if p["metadata"]["name"] == name]
    assert len(pods) == 1, [p["metadata"]["name"] for p in kube.pods()]
    return copy.deepcopy(pods[0])


def notebook(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    return c


def own_tolerations(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's tolerations but the two the API server's DefaultTolerationSeconds
    admission plugin adds to every pod (not-ready and unreachable, for 300 s)."""
    added = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    return [t for t in pod["spec"]["tolerations"] if t["key"] not in added]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in notebook(pod).get("env") or []}


async def _start(spawner: Any) -> Any:
    """What the Hub's User.spawn awaits: the pre-spawn hook (the queue), then start()."""
    await spawner.run_pre_spawn_hook()
    return await asyncio.wait_for(spawner.start(), spawner.start_timeout + 5)


async def test_two_starts_in_a_row_2_gpus_then_0_leak_nothing(
    kube: KubeOnCluster, gateway: Any, make_spawner: Any
) -> None:
    """Start with 2 a100, stop, start with 0: the second pod has no GPU, no pin, no
    flavor selector or toleration; both are built from the same configured values."""
    cluster(kube)
    spawner = make_spawner()
    spawner.user_options = {"tenant": "vision", "flavor": "a100", "gpus": 2}
    url = await _start(spawner)
    first = created_pod(kube)
    # The pod's IP, which KWOK hands out of a loopback range.
    assert url.startswith(f"http://{first['status']['podIP']}:")
    rid = spawner._rid
    assert first["spec"]["nodeName"] == "a100-0"
    assert notebook(first)["resources"]["limits"] == {
        "ephemeral-storage": "10Gi",
        "nvidia.com/gpu": "2",
    }
    # The GPUs requested by the spawner; the API server defaults the other requests to
    # their limits.
    assert notebook(first)["resources"]["requests"] == {
        "ephemeral-storage": "10Gi",
        "nvidia.com/gpu": "2",
    }
    assert first["spec"]["nodeSelector"] == A100
    assert own_tolerations(first) == [
        {"key": "spot", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert first["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": ["a100-0"],
                            }
                        ]
                    }
                ]
            }
        }
    }
    env = env_of(first)
    assert env["GPUAAS_REQUEST_ID"] == rid and env["GPUAAS_FLAVOR"] == "a100"
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin sets it
    admin = GatewayClient(gateway.url, TOKENS["root"])
    assert (await admin.get(rid))["state"] == "admitted"

    await spawner.stop()
    await wait_until(lambda: not kube.pods())
    assert (await admin.get(rid))["state"] in ("finished", "cancelled")

    spawner.user_options = {"tenant": "vision", "gpus": 0}
    await _start(spawner)
    second = created_pod(kube)
    assert second["spec"]["nodeName"] == "cpu-0"
    assert notebook(second)["resources"]["limits"] == {"ephemeral-storage": "10Gi"}
    assert notebook(second)["resources"]["requests"] == {"ephemeral-storage": "10Gi"}
    assert second["spec"]["nodeSelector"] == {"team": "ml"}
    assert own_tolerations(second) == [{"key": "spot", "operator": "Exists"}]
    assert "affinity" not in second["spec"]
    env = env_of(second)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert not any(k.startswith("GPUAAS_REQUEST") for k in env)
    assert spawner._rid is None  # no gateway request for a CPU server
    # The configured traits are what they were: nothing of the grant was written there.
    assert spawner.node_selector == {"team": "ml"}
    assert spawner.tolerations == [{"key": "spot", "operator": "Exists"}]
    assert spawner.extra_resource_limits == {"ephemeral-storage": "10Gi"}
    assert spawner.extra_resource_guarantees == {}

    # Everything but the grant's parts is the same in both manifests.
    def without_grant(pod: dict[str, Any]) -> dict[str, Any]:
        spec = copy.deepcopy(pod["spec"])
        for k in ("nodeName", "nodeSelector", "tolerations", "affinity"):
            spec.pop(k, None)
        c = notebook({"spec": spec})
        c.pop("resources")
        c["env"] = [
            e
            for e in c["env"]
            if e["name"] not in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
            and not e["name"].startswith("GPUAAS_")
        ]
        return spec

    assert without_grant(first) == without_grant(second)
    await spawner.stop()
    await wait_until(lambda: not kube.pods())
    # Nothing left behind: no request holds or waits for GPUs, and the namespace holds
    # nothing of the servers but the Events of their pods.
    held = [r for r in await admin.list() if r["state"] in ("queued", "admitted")]
    assert held == []
    left = kube.left_behind()
    assert left == set(), left


async def test_progress_while_queued_then_start_and_stop(
    kube: KubeOnCluster, gateway: Any, make_spawner: Any
) -> None:
    """A spawn that finds the a100s taken waits in the queue, says so in progress(), starts
    its pod on the granted node once they are released, and releases them on stop."""
    cluster(kube)
    bob = GatewayClient(gateway.url, TOKENS["bob"])
    blocker = await bob.submit("vision", "job", 2, flavor="a100")
    assert blocker["state"] == "admitted"
    spawner = make_spawner()
    spawner.user_options = {"tenant": "vision", "flavor": "a100", "gpus": 2}
    messages: list[str] = []

    async def follow() -> None:
        async for event in spawner.progress():
            messages.append(event.get("message", ""))

    spawn = asyncio.ensure_future(_start(spawner))
    follower = asyncio.ensure_future(follow())
    await wait_until(lambda: any("queued" in m.lower() for m in messages))
    assert not kube.pods()  # no pod while queued: nothing Pending on the cluster
    assert not spawn.done()
    await bob.cancel(blocker["id"])
    await asyncio.wait_for(spawn, 30)
    pod = created_pod(kube)
    assert pod["spec"]["nodeName"] == "a100-0"
    assert notebook(pod)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    await asyncio.wait_for(follower, 10)
    assert any("admitted" in m.lower() or "granted" in m.lower() for m in messages), messages
    rid = spawner._rid
    assert await spawner.poll() is None
    await spawner.stop()
    await wait_until(lambda: not kube.pods())
    admin = GatewayClient(gateway.url, TOKENS["root"])
    assert (await admin.get(rid))["state"] in ("finished", "cancelled")


async def test_a_pod_that_fails_to_schedule_times_out_and_releases_its_grant(
    kube: KubeOnCluster, gateway: Any, make_spawner: Any
) -> None:
    """The gateway grants the t4 node, but the t4 Node is cordoned: the pod stays
    Pending, progress() shows the scheduler's FailedScheduling message, start() times out
    (start_timeout, not the queue's), and stop() — which the Hub calls after a failed
    spawn — deletes the pod and releases the grant."""
    cluster(kube)
    kube.add_node(
        "t4-0",
        labels={"pool": "t4", "team": "ml"},
        allocatable={"nvidia.com/gpu": "1"},
        unschedulable=True,
    )
    spawner = make_spawner(start_timeout=3)
    spawner.user_options = {"tenant": "vision", "flavor": "t4", "gpus": 1}
    messages: list[str] = []

    async def follow() -> None:
        async for event in spawner.progress():
            messages.append(event.get("message", ""))

    follower = asyncio.ensure_future(follow())
    with pytest.raises(TimeoutError, match="did not start"):
        await _start(spawner)
    pod = created_pod(kube)
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["t4-0"]
    # The real scheduler's FailedScheduling event, as progress() passes it on.
    await wait_until(lambda: any(re.search(r"0/\d+ nodes are available", m) for m in messages))
    rid = spawner._rid
    await spawner.stop()
    follower.cancel()
    await wait_until(lambda: not kube.pods())
    admin = GatewayClient(gateway.url, TOKENS["root"])
    assert (await admin.get(rid))["state"] in ("finished", "cancelled")
    assert (await admin.tenants())["tenants"][0]["usage"]


async def test_profiles_compose_with_the_queue(
    kube: KubeOnCluster, gateway: Any, make_spawner: Any
) -> None:
    """profile_list keeps working: the form shows the queue's choices and the profiles,
    the form data gives both, and a profile's `gpuaas` block fixes its GPUs while its
    kubespawner_override still sets the image."""
    cluster(kube)
    profiles = [
        {"display_name": "CPU only", "slug": "cpu", "default": True},
        {
            "display_name": "PyTorch on 2 A100",
            "slug": "torch-a100",
            "gpuaas": {"gpus": 2, "flavor": "a100"},
            "kubespawner_override": {"image": "pytorch/pytorch:2.5"},
        },
    ]
    spawner = make_spawner(profile_list=profiles)
    form = await spawner.options_form(spawner)
    assert 'name="tenant"' in form and 'name="gpus"' in form  # the queue's choices
    assert "PyTorch on 2 A100" in form and 'name="profile"' in form  # KubeSpawner's
    options = spawner.options_from_form(
        {"profile": ["torch-a100"], "tenant": ["vision"], "gpus": ["0"]}
    )
    assert options == {"profile": "torch-a100", "tenant": "vision", "gpus": 0}
    spawner.user_options = options
    await _start(spawner)
    pod = created_pod(kube)
    assert notebook(pod)["image"] == "pytorch/pytorch:2.5"
    assert notebook(pod)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["spec"]["nodeName"] == "a100-0"
    await spawner.stop()
    await wait_until(lambda: not kube.pods())


async def test_a_hub_that_cannot_be_reached_to_stop_a_server_is_said_not_raised() -> None:
    """The gateway ended a server's grant and the spawner stops the server through the
    Hub's API, but the Hub is down (nothing listens on its port): the spawner says so in
    its log; nothing is raised into the task nobody awaits (it was "Task exception was
    never retrieved"). The mixin's own code, shared by every spawner of ours: shown on the
    local one, which needs no cluster."""
    from helpers import free_port
    from jupyterhub.objects import Hub
    from kubefix import HubUser

    from jupyter_gpuaas.hub.local import QueuedSimpleLocalProcessSpawner

    said: list[logging.LogRecord] = []
    log = logging.getLogger("gpuaas-test-spawner")  # the Hub's log, here a list
    handler = logging.Handler()
    handler.emit = said.append  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        user = HubUser("alice", ["vision"])
        spawner = QueuedSimpleLocalProcessSpawner(
            user=user,
            orm_spawner=user.orm_spawner(),
            hub=Hub(ip="127.0.0.1", port=free_port(), base_url="/hub/"),
            gateway_url="http://127.0.0.1:1",
            api_token="hub-token-for-the-server",
            log=log,
        )
        await spawner._stop_through_hub()
    finally:
        log.removeHandler(handler)
    messages = [r.getMessage() for r in said]
    assert any(m.startswith("could not reach the Hub to stop") for m in messages), messages
