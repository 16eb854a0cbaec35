"""NvmlInventory against a real GPU. Skipped wherever NVML or a device is missing.

They run where a GPU is (`pytest -m gpu tests/gpu`): every device is named by its UUID
(`GPU-…`, or `MIG-…` for a MIG instance), a grant's launch environment names that UUID,
and a process started with it sees exactly that device. The child asks the CUDA driver
itself (libcuda through ctypes: no torch needed), since NVML ignores CUDA_VISIBLE_DEVICES
(tests/gpu/gpuutil.py holds the children).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gpuutil import BURNER, CUDA_CHILD, array_library, child_env, gpu_count, seen_by_child

from jupyter_gpuaas.client import launch_environment
from jupyter_gpuaas.devices import DeviceInfo, NvmlInventory, attribute, parse_devices_spec


def _nvml_view() -> tuple[int, set[str]]:
    """(grantable devices, UUIDs of whole GPUs) straight from pynvml: a GPU in MIG mode
    counts as its MIG instances, any other as itself."""
    import pynvml

    pynvml.nvmlInit()
    try:
        count, whole = 0, set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mig_on = pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                mig_on = False
            if not mig_on:
                count += 1
                whole.add(pynvml.nvmlDeviceGetUUID(h))
                continue
            for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
                except pynvml.NVMLError_NotFound:
                    continue
                count += 1
        return count, whole
    finally:
        pynvml.nvmlShutdown()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="no NVML library or no NVIDIA GPU here"),
]


@pytest.fixture
def inventory() -> Iterator[NvmlInventory]:
    inv = parse_devices_spec("nvml")
    assert isinstance(inv, NvmlInventory)
    yield inv
    inv.close()


def test_enumerates_every_gpu_by_uuid(inventory: NvmlInventory) -> None:
    devices = inventory.devices()
    expected, whole = _nvml_view()
    assert len(devices) == expected
    assert not inventory.simulated
    assert inventory.message.startswith("NVML: ")
    for d in devices:
        assert d.model and d.flavor and d.flavor == d.flavor.lower()
        # A MIG instance is named by its MIG UUID; every other device by its GPU UUID.
        assert d.uuid.startswith("MIG-" if d.mig_profile else "GPU-"), d
        assert not d.mig_profile or d.parent_uuid.startswith("GPU-")
        assert d.memory_total > 1024**3
    assert len({d.uuid for d in devices}) == len(devices)
    assert {d.uuid for d in devices if not d.mig_profile} == whole
    assert sum(n.gpus for n in inventory.nodes()) == len(devices)


def _grant(inventory: NvmlInventory, devices: list[DeviceInfo]) -> dict[str, Any]:
    """A request object as the gateway answers it for these devices (one node)."""
    node = devices[0].node
    indices = [d.index for d in devices]
    return {
        "id": "r-gpu-test",
        "tenant": "vision",
        "grant": {
            "node": node,
            "flavor": devices[0].flavor,
            "devices": indices,
            "uuids": inventory.uuids(node, indices),
        },
    }


def test_launch_environment_names_each_devices_uuid(inventory: NvmlInventory) -> None:
    for d in inventory.devices():
        env = launch_environment(_grant(inventory, [d]))
        assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == d.uuid
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["GPUAAS_NODE"] == d.node


def _bare(uuid: str) -> str:
    return uuid.split("-", 1)[1]  # "GPU-…"/"MIG-…" → the 8-4-4-4-12 hex


def test_a_process_launched_with_a_grant_sees_exactly_its_device(
    inventory: NvmlInventory,
) -> None:
    for d in inventory.devices():
        assert seen_by_child(_grant(inventory, [d])) == [_bare(d.uuid)], d


def test_a_two_device_grant_sees_both_in_the_grants_order(inventory: NvmlInventory) -> None:
    # CUDA shows one MIG instance per process at most: whole GPUs of one node only.
    by_node: dict[str, list[DeviceInfo]] = {}
    for d in inventory.devices():
        if not d.mig_profile:
            by_node.setdefault(d.node, []).append(d)
    pair = next((ds[:2] for ds in by_node.values() if len(ds) >= 2), None)
    if pair is None:
        pytest.skip("no node here has two whole GPUs")
    backwards = [pair[1], pair[0]]
    assert seen_by_child(_grant(inventory, backwards)) == [_bare(d.uuid) for d in backwards]


def test_the_launched_process_shows_on_its_device_only(inventory: NvmlInventory) -> None:
    """NVML ignores CUDA_VISIBLE_DEVICES, but it lists the compute contexts of each
    device: the child's context is on its granted device and on no other."""
    d = inventory.devices()[-1]  # the last: on a mixed host, not position 0 of NVML
    proc = subprocess.Popen(
        [sys.executable, "-c", CUDA_CHILD, "hold"],
        env=child_env(_grant(inventory, [d])),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        answer = json.loads(proc.stdout.readline())
        if "skip" in answer:
            pytest.skip(answer["skip"])
        assert answer.get("uuids") == [_bare(d.uuid)], answer
        on: set[tuple[str, int]] = set()
        others: set[int] = set()
        deadline = time.time() + 10
        while time.time() < deadline and not on:
            for s in inventory.sample():
                others |= set(s.processes)
                if proc.pid in s.processes:
                    on.add((s.node, s.index))
            time.sleep(0.5)
        if not on:
            if others:
                pytest.skip(f"NVML reports PIDs {others} from another PID namespace")
            pytest.skip("NVML lists no compute processes here (NotSupported or no rights)")
        assert on == {(d.node, d.index)}
    finally:
        proc.kill()
        proc.wait()


def test_sample_reads_every_device(inventory: NvmlInventory) -> None:
    samples = inventory.sample()
    assert len(samples) == len(inventory.devices())
    for s in samples:
        assert s.healthy, s.error
        assert 0.0 <= s.utilization <= 1.0
        assert s.memory_used >= 0
        assert s.temperature is None or 0 < s.temperature < 120
        assert s.power is None or 0 < s.power < 2000  # watts, not milliwatts


def test_flavor_override(inventory: NvmlInventory) -> None:
    named = parse_devices_spec("nvml:flavor=house,node=box")
    try:
        # MIG instances keep their profile after the override: house-mig-1g.10gb.
        flavors = {d.flavor for d in named.devices()}
        assert flavors <= {"house"} | {f for f in flavors if f.startswith("house-mig-")}
        assert all(n.name == "box" or n.name.startswith("box-") for n in named.nodes())
    finally:
        named.close()


def test_per_process_attribution_of_a_busy_process(inventory: NvmlInventory) -> None:
    lib = array_library()
    if lib is None:
        pytest.skip("neither torch nor cupy is importable to load the GPU")
    env = child_env(_grant(inventory, [inventory.devices()[0]]))
    proc = subprocess.Popen(
        [sys.executable, "-c", BURNER, lib, "20"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        d0 = inventory.devices()[0]
        holders = {(d0.node, d0.index): ("r1", "alice", "vision", [proc.pid])}
        seen_pids: set[int] = set()
        best = None
        deadline = time.time() + 12
        while time.time() < deadline:
            time.sleep(1.0)
            samples = inventory.sample()
            s0 = next(s for s in samples if (s.node, s.index) == (d0.node, d0.index))
            seen_pids |= set(s0.processes)
            best = attribute(samples, holders)["r1"]
            if best.process_seen and best.utilization > 0.2:
                break
        assert best is not None
        assert best.utilization > 0.2, "a matmul loop should keep the GPU busy"
        if not best.process_seen:
            if seen_pids:
                pytest.skip(f"NVML reports PIDs {seen_pids} from another PID namespace")
            pytest.fail("no process showed on the device while one computed on it")
        assert s0.memory_used > 0
    finally:
        proc.kill()
        proc.wait()
