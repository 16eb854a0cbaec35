"""The gateway on a real GPU: grants, launches and idle culling. Skipped without one.

A real gateway process (`python -m jupyter_gpuaas.gateway.app --devices nvml`, SQLite,
real HTTP) over this host's own GPUs, with quotas sized from what NVML shows. A process
launched with a grant's environment is the kernel; its GPU activity is read the way a
single-user server reads it (`GpuUsage`, NVML per-process utilization, judged by
`decide_busy` with the extension's default threshold) and heartbeated, so a kernel that
computes keeps its GPU past the idle timeout and one that only holds a context loses it
to the next request in line.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpuutil import BURNER, array_library, child_env, gpu_count, seen_by_child
from gwutil import gateway_env, launch_gateway
from helpers import wait_for

from jupyter_gpuaas.client import SyncGatewayClient
from jupyter_gpuaas.devices import DeviceInfo, parse_devices_spec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="no NVML library or no NVIDIA GPU here"),
]

TOKEN = "alice-gpu-token-01"
ROOT = "root-gpu-token-002"
IDLE_TIMEOUT = 4.0  # seconds of idleness before a kernel is culled (the quotas' policy)
BUSY_THRESHOLD = 0.05  # ServerExtension.busy_utilization's default


def _local_devices() -> list[DeviceInfo]:
    inv = parse_devices_spec("nvml")
    try:
        return list(inv.devices())
    finally:
        inv.close()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, DeviceInfo]]:
    """(URL, the device every test here is granted): the gateway over this host."""
    devices = _local_devices()
    first = devices[0]
    flavors: dict[str, dict[str, int]] = {}
    for d in devices:
        f = flavors.setdefault(d.flavor, {"nodes": 1, "gpus_per_node": 0})
        f["gpus_per_node"] += 1
    quotas = {
        "flavors": flavors,
        "tenants": {"vision": {"quota": {f: v["gpus_per_node"] for f, v in flavors.items()}}},
        "policy": {"idle_timeout": IDLE_TIMEOUT},
    }
    tokens = {
        "tokens": {
            TOKEN: {"user": "alice", "groups": ["vision"]},
            ROOT: {"user": "root", "admin": True},
        }
    }
    gp = launch_gateway(
        tmp_path, f"sqlite:///{tmp_path / 'gpuaas.db'}", quotas=quotas, tokens=tokens,
        devices="nvml", env=gateway_env(drop=("CUDA_", "JUPYTERHUB_")),
        log=tmp_path / "gateway.log", timeout=60,
    )  # fmt: skip
    try:
        yield gp.url, first
    finally:
        gp.stop()
        print(gp.tail())


def test_a_grant_names_a_device_of_this_host_and_its_process_sees_only_that(
    gateway: tuple[str, DeviceInfo],
) -> None:
    url, first = gateway
    alice = SyncGatewayClient(url, TOKEN, timeout=10)
    every = [d for d in _local_devices() if d.flavor == first.flavor]

    held = alice.submit("vision", "kernel", 1, flavor=first.flavor)
    assert held["state"] == "admitted", held
    (uuid,) = held["grant"]["uuids"]
    assert uuid in {d.uuid for d in every}
    assert seen_by_child(held) == [uuid.split("-", 1)[1]]

    # The gateway's own view: that device is held by that request, by UUID.
    listed = SyncGatewayClient(url, ROOT, timeout=10).devices()["devices"]
    holder = {d["uuid"]: (d["holder"] or {}).get("id") for d in listed}
    assert holder[uuid] == held["id"]
    assert set(holder) == {d.uuid for d in _local_devices()}

    # Every GPU of the flavor taken, one more waits and says why in words.
    rest = [alice.submit("vision", "kernel", 1, flavor=first.flavor) for _ in every[1:]]
    assert all(r["state"] == "admitted" for r in rest), rest
    waiting = alice.submit("vision", "kernel", 1, flavor=first.flavor)
    assert waiting["state"] == "queued", waiting
    why = waiting["waiting_for"]
    assert why["kind"] == "quota" and "vision uses" in why["message"], why
    assert first.flavor in why["message"], why

    alice.cancel(held["id"])
    after = wait_for(lambda: _admitted(alice, waiting["id"]), 10, "the waiting request")
    assert after["grant"]["uuids"] == [uuid]  # the one device freed, granted again


def _admitted(client: SyncGatewayClient, rid: str) -> dict[str, Any] | None:
    got = client.get(rid)
    return got if got["state"] == "admitted" else None


def _busy_now(usage: Any, kernel_id: str, grant: dict[str, Any], pid: int) -> tuple[bool, float]:
    """What the server's activity round would heartbeat for this kernel, and its reading."""
    from jupyter_gpuaas.server.activity import Holder, decide_busy

    holder = Holder(kernel_id, grant["node"], grant["devices"], {pid}, grant["uuids"])
    utilization = usage.utilization([holder])[kernel_id]
    return decide_busy("idle", None, None, utilization, BUSY_THRESHOLD), utilization


def _start(lib: str, grant: dict[str, Any], seconds: float, *mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BURNER, lib, str(seconds), *mode],
        env=child_env(grant),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_computing_kernel_keeps_its_gpu_and_an_idle_one_is_culled(
    gateway: tuple[str, DeviceInfo],
) -> None:
    lib = array_library()
    if lib is None:
        pytest.skip("neither torch nor cupy is importable to load the GPU")
    from jupyter_gpuaas.server.activity import GpuUsage

    url, first = gateway
    alice = SyncGatewayClient(url, TOKEN, timeout=10)
    every = [d for d in _local_devices() if d.flavor == first.flavor]
    grants = [alice.submit("vision", "kernel", 1, flavor=first.flavor) for _ in every]
    kernel = grants[0]
    for other in grants[1:]:
        alice.cancel(other["id"])
    grant = kernel["grant"]
    usage = GpuUsage()
    assert usage.available, usage.message

    # Computing: the heartbeats say busy, and it outlives the idle timeout twice over.
    burner = _start(lib, grant, 3 * IDLE_TIMEOUT + 10)
    readings: list[float] = []
    try:
        end = time.monotonic() + 2 * IDLE_TIMEOUT
        while time.monotonic() < end:
            busy, utilization = _busy_now(usage, kernel["id"], grant, burner.pid)
            readings.append(utilization)
            alice.heartbeat(kernel["id"], busy=busy, utilization=utilization)
            time.sleep(0.5)
        if max(readings) == 0.0:
            pytest.skip("NVML shows no per-process utilization here (another PID namespace?)")
        assert sum(r > BUSY_THRESHOLD for r in readings) >= len(readings) // 2, readings
        assert alice.get(kernel["id"])["state"] == "admitted"
    finally:
        burner.kill()
        burner.wait()
    # As in use, where the next holder starts well after the grant is handed on; NVML
    # stamps its samples about every 0.5 s, so the burner's last one is now a second old.
    time.sleep(1.0)

    # Holding a context and computing nothing: idle, culled, and the GPU goes to the next.
    # Its heartbeats say what the reading says, as the server's round would.
    waiting = alice.submit("vision", "kernel", 1, flavor=first.flavor)
    idler = _start(lib, grant, 3 * IDLE_TIMEOUT + 10, "idle")
    try:
        t0 = time.monotonic()
        idle_readings: list[float] = []
        while alice.get(kernel["id"])["state"] == "admitted":
            assert time.monotonic() - t0 < 2 * IDLE_TIMEOUT + 4, idle_readings
            busy, utilization = _busy_now(usage, kernel["id"], grant, idler.pid)
            idle_readings.append(utilization)
            assert not busy, idle_readings
            alice.heartbeat(kernel["id"], busy=busy, utilization=utilization)
            time.sleep(0.5)
        # From its first reading on: NVML's first window for a new PID can carry the
        # burner's last sample, which the inventory drops as older than the process.
        assert all(r <= BUSY_THRESHOLD for r in idle_readings), idle_readings
        culled = alice.get(kernel["id"])
        assert culled["state"] == "culled", culled
        assert time.monotonic() - t0 >= IDLE_TIMEOUT - 1
        next_one = wait_for(lambda: _admitted(alice, waiting["id"]), 10, "the next request")
        assert next_one["grant"]["uuids"] == grant["uuids"]
    finally:
        idler.kill()
        idler.wait()
        usage.close()
