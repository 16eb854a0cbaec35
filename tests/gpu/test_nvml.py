"""NvmlInventory against a real GPU. Skipped wherever NVML or a device is missing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from jupyter_gpuaas.devices import NvmlInventory, attribute, parse_devices_spec


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpu_count() == 0, reason="no NVML library or no NVIDIA GPU here"),
]


@pytest.fixture
def inventory() -> Iterator[NvmlInventory]:
    inv = parse_devices_spec("nvml")
    assert isinstance(inv, NvmlInventory)
    yield inv
    inv.close()


def test_enumerates_every_gpu(inventory: NvmlInventory) -> None:
    devices = inventory.devices()
    assert len(devices) == _gpu_count()
    assert not inventory.simulated
    assert inventory.message.startswith("NVML: ")
    for d in devices:
        assert d.model and d.flavor and d.flavor == d.flavor.lower()
        assert d.uuid.startswith(("GPU-", "MIG-"))
        assert d.memory_total > 1024**3
    assert sum(n.gpus for n in inventory.nodes()) == len(devices)


def test_sample_reads_every_device(inventory: NvmlInventory) -> None:
    t0 = time.perf_counter()
    samples = inventory.sample()
    elapsed = time.perf_counter() - t0
    assert len(samples) == len(inventory.devices())
    for s in samples:
        assert s.healthy, s.error
        assert 0.0 <= s.utilization <= 1.0
        assert s.memory_used >= 0
        assert s.temperature is None or 0 < s.temperature < 120
        assert s.power is None or 0 < s.power < 2000  # watts, not milliwatts
    assert elapsed < 2.0, f"sampling took {elapsed:.2f}s"


def test_flavor_override(inventory: NvmlInventory) -> None:
    named = parse_devices_spec("nvml:flavor=house,node=box")
    try:
        assert {d.flavor for d in named.devices()} == {"house"}
        assert [n.name for n in named.nodes()] == ["box"]
    finally:
        named.close()


_BURNER = """
import sys, time
mod = sys.argv[1]
if mod == "torch":
    import torch
    x = torch.randn(4096, 4096, device="cuda")
    step = lambda: torch.mm(x, x)
    sync = torch.cuda.synchronize
else:
    import cupy
    x = cupy.random.rand(4096, 4096, dtype=cupy.float32)
    step = lambda: x @ x
    sync = cupy.cuda.Device().synchronize
print("ready", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(20):
        step()
    sync()
"""


def test_per_process_attribution_of_a_busy_process(inventory: NvmlInventory) -> None:
    lib = next((m for m in ("torch", "cupy") if importlib.util.find_spec(m)), None)
    if lib is None:
        pytest.skip("neither torch nor cupy is importable to load the GPU")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": inventory.devices()[0].uuid}
    proc = subprocess.Popen(
        [sys.executable, "-c", _BURNER, lib, "20"], env=env, stdout=subprocess.PIPE, text=True
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
