"""Device inventory: spec parsing, simulated nodes and load, NVML absence, attribution."""

from __future__ import annotations

import argparse
import json
import logging
import time

import pytest

from jupyter_gpuaas.devices import (
    DeviceSample,
    NvmlInventory,
    SimulatedInventory,
    attribute,
    flavor_from_model,
    parse_devices_spec,
)
from jupyter_gpuaas.devices import cli as devices_cli
from jupyter_gpuaas.devices.nvml import process_start


def _nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def test_simulated_spec_builds_named_nodes() -> None:
    inv = parse_devices_spec("simulated:a100=2x4,t4=1x8")
    assert isinstance(inv, SimulatedInventory)
    assert inv.simulated
    assert inv.message == "simulated devices: a100=2x4,t4=1x8 (no real GPUs)"
    assert [(n.name, n.flavor, n.gpus) for n in inv.nodes()] == [
        ("a100-0", "a100", 4),
        ("a100-1", "a100", 4),
        ("t4-0", "t4", 8),
    ]
    devs = inv.devices()
    assert len(devs) == 16
    assert all("simulated" in d.model for d in devs)
    a100 = next(d for d in devs if d.flavor == "a100")
    assert a100.memory_total == 80 * 1024**3
    # Simulated devices have no UUID: nothing real to name, so grants carry none and
    # launch environments name the indices.
    assert {d.uuid for d in devs} == {""}
    assert inv.uuids("a100-0", [0, 1]) is None


def test_simulated_spec_tolerates_spaces_and_zero_nodes() -> None:
    inv = parse_devices_spec(" simulated: a100 = 0x4 , h200=1x8 ")
    assert [n.name for n in inv.nodes()] == ["h200-0"]
    assert inv.gpus_per_node == {"a100": 4, "h200": 8}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "bad devices spec"),
        ("cuda", "bad devices spec"),
        ("simulated", "simulated needs flavors"),
        ("simulated:", "simulated needs flavors"),
        ("simulated:a100", "expected FLAVOR=NODESxGPUS"),
        ("simulated:a100=2", "expected FLAVOR=NODESxGPUS"),
        ("simulated:a100=2x", "expected FLAVOR=NODESxGPUS"),
        ("simulated:a100=-1x4", "expected FLAVOR=NODESxGPUS"),
        ("simulated:a100=1x0", "at least 1 GPU"),
        ("simulated:A100=1x4", "bad flavor"),
        ("simulated:a100=1x4,a100=2x4", "given twice"),
        ("nvml:flavor", "bad nvml option"),
        ("nvml:color=red", "bad nvml option"),
        ("nvml:flavor=A 100", "bad flavor"),
    ],
)
def test_bad_specs_raise_one_line_value_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_devices_spec(spec)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("model", "flavor"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA", "gpu"),
    ],
)
def test_flavor_from_model(model: str, flavor: str) -> None:
    assert flavor_from_model(model) == flavor


def test_simulated_samples_idle_by_default_and_follow_the_load_hook() -> None:
    inv = parse_devices_spec("simulated:a100=1x2")
    assert isinstance(inv, SimulatedInventory)
    idle = {(s.node, s.index): s for s in inv.sample()}
    assert set(idle) == {("a100-0", 0), ("a100-0", 1)}
    assert all(s.utilization == 0.0 and s.memory_used == 0 and s.healthy for s in idle.values())

    inv.set_load("a100-0", 1, 0.9, processes={4242: 0.9})
    busy = {(s.node, s.index): s for s in inv.sample()}
    assert busy[("a100-0", 1)].utilization == 0.9
    assert busy[("a100-0", 1)].memory_used > 0
    assert busy[("a100-0", 1)].processes == {4242: 0.9}
    assert busy[("a100-0", 1)].power > busy[("a100-0", 0)].power  # type: ignore[operator]
    assert busy[("a100-0", 0)].utilization == 0.0

    inv.set_load("a100-0", 0, 0.0, healthy=False)
    broken = {(s.node, s.index): s for s in inv.sample()}[("a100-0", 0)]
    assert not broken.healthy and broken.error

    with pytest.raises(ValueError):
        inv.set_load("a100-0", 0, 1.5)


def test_simulated_add_and_remove_nodes() -> None:
    inv = parse_devices_spec("simulated:a100=2x4")
    assert isinstance(inv, SimulatedInventory)
    added = inv.add_node("a100")
    assert (added.name, added.gpus) == ("a100-2", 4)
    inv.set_load("a100-2", 0, 0.5)
    inv.remove_node("a100-0")
    assert [n.name for n in inv.nodes()] == ["a100-1", "a100-2"]
    # Names are not reused: the core may still remember a removed node.
    assert inv.add_node("a100").name == "a100-3"
    # The core names nodes itself on node_ready; the inventory keeps its name.
    assert inv.add_node("a100", name="a100-7").name == "a100-7"
    assert inv.add_node("a100").name == "a100-8"
    # A new flavor needs its GPU count once; later nodes reuse it.
    assert inv.add_node("t4", 8).name == "t4-0"
    assert inv.add_node("t4").gpus == 8
    with pytest.raises(ValueError):
        inv.add_node("h100")
    with pytest.raises(ValueError):
        inv.add_node("a100", name="a100-7")
    with pytest.raises(KeyError):
        inv.remove_node("a100-0")
    inv.remove_node("a100-2")
    assert ("a100-2", 0) not in {(s.node, s.index) for s in inv.sample()}


@pytest.mark.skipif(_nvml_available(), reason="NVML is present here; see tests/gpu")
def test_nvml_absent_means_zero_gpus_and_one_clear_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="jupyter_gpuaas.devices"):
        inv = parse_devices_spec("nvml")
    assert isinstance(inv, NvmlInventory)
    assert not inv.simulated
    assert inv.nodes() == [] and inv.devices() == [] and inv.sample() == []
    assert inv.message == "no NVML library found: this gateway sees 0 GPUs"
    records = [r for r in caplog.records if r.name == "jupyter_gpuaas.devices"]
    assert len(records) == 1
    assert "no NVML library found" in records[0].getMessage()
    with pytest.raises(NotImplementedError):
        inv.add_node("a100", 1)
    inv.close()
    inv.close()


def test_attribution_per_request() -> None:
    samples = [
        DeviceSample("a100-0", 0, 0.10, 0, 40.0, 100.0, True, {100: 0.10}),
        DeviceSample("a100-0", 1, 0.80, 0, 60.0, 300.0, True, {200: 0.75, 999: 0.05}),
        DeviceSample("a100-1", 0, 0.00, 0, 30.0, 60.0, True, {}),
    ]
    holders = {
        ("a100-0", 0): ("r1", "alice", "vision", [100]),
        ("a100-0", 1): ("r1", "alice", "vision", [100]),
        ("a100-1", 0): ("r2", "bob", "nlp", [300]),
        ("a100-9", 0): ("r3", "carol", "nlp", [400]),  # no sample: device gone
    }
    result = attribute(samples, holders)
    r1, r2, r3 = result["r1"], result["r2"], result["r3"]
    assert r1.utilization == 0.80 and r1.process_seen and r1.process_utilization == 0.10
    assert r1.devices == [("a100-0", 0), ("a100-0", 1)]
    assert (r1.user, r1.tenant) == ("alice", "vision")
    assert r2.utilization == 0.0 and not r2.process_seen and r2.process_utilization is None
    assert r3.utilization == 0.0 and not r3.process_seen and r3.devices == [("a100-9", 0)]


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    devices_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    rc: int = devices_cli.run(args)
    return rc


def test_cli_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["devices", "--devices", "simulated:t4=1x2"]) == 0
    out = capsys.readouterr().out
    assert "NODE" in out and "t4-0" in out and "Tesla T4 (simulated)" in out
    assert out.rstrip().endswith("simulated devices: t4=1x2 (no real GPUs)")

    assert _cli(["devices", "--json", "--devices", "simulated:t4=1x2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"simulated", "message", "nodes", "devices"}
    assert doc["simulated"] is True
    assert doc["nodes"] == [{"name": "t4-0", "flavor": "t4", "gpus": 2}]
    assert [d["index"] for d in doc["devices"]] == [0, 1]
    assert doc["devices"][0]["healthy"] is True


def test_cli_bad_spec_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["devices", "--devices", "simulated:x"]) == 2
    assert "expected FLAVOR=NODESxGPUS" in capsys.readouterr().err


class _FakeNvml:
    """Just enough of pynvml to drive NvmlInventory without a GPU: two H200s, where the
    second has no power sensor and then loses its memory query."""

    def __init__(self) -> None:
        import pynvml

        self.NVMLError = pynvml.NVMLError
        self.NVMLError_NotSupported = pynvml.NVMLError_NotSupported
        self.NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
        self.NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
        self.lost = False
        self.shutdowns = 0
        self.busy_pid = 1000  # the PID of device 0's per-process sample
        self.stamp: int | None = None  # its timeStamp (µs since the epoch); None: now

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        if h == 1 and self.lost:
            import pynvml

            raise pynvml.NVMLError_GpuIsLost()
        return argparse.Namespace(total=141 * 2**30, used=(h + 1) * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return argparse.Namespace(gpu=50 * h, memory=0)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 40 + h

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise self.NVMLError_NotSupported()
        return 123456  # mW

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[object]:
        return [argparse.Namespace(pid=1000 + h, usedGpuMemory=2**30)]

    def nvmlDeviceGetProcessUtilization(self, h: int, since: int) -> list[object]:
        if h == 1:
            import pynvml

            raise pynvml.NVMLError_NotFound()
        stamp = self.stamp if self.stamp is not None else max(since + 5, int(time.time() * 1e6))
        return [argparse.Namespace(pid=self.busy_pid, smUtil=70, timeStamp=stamp)]


def test_nvml_inventory_against_a_fake_library(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inv = NvmlInventory(node="box")
    assert [(n.name, n.flavor, n.gpus) for n in inv.nodes()] == [("box", "h200", 2)]
    assert inv.message == "NVML: box: 2× h200"
    s0, s1 = inv.sample()
    assert (s0.utilization, s0.memory_used, s0.temperature, s0.power) == (0.0, 2**30, 40.0, 123.456)
    assert s0.processes == {1000: 0.7} and s0.healthy
    # No power sensor is a property of the board, not ill health.
    assert s1.healthy and s1.power is None and s1.processes == {1001: 0.0}
    assert s1.utilization == 0.5
    fake.lost = True
    s0, s1 = inv.sample()  # never raises; the failing device turns unhealthy
    assert s0.healthy and not s1.healthy and "memory" in s1.error
    inv.close()
    inv.close()
    assert fake.shutdowns == 1


def test_a_sample_stamped_before_its_process_started_is_not_its_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an H200, NVML's first window for a new process carried the previous holder's
    last sample (92-99 %), stamped before the new PID existed: that reading is dropped, so a
    kernel that just started does not read busy with its predecessor's work."""
    import os
    import sys

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inv = NvmlInventory(node="box")
    fake.busy_pid = os.getpid()
    started = process_start(os.getpid())
    assert started is not None and abs(started - time.time()) < 86400  # a real start time
    for before in (1.0, 0.1):  # 0.1 s: the gap seen on the H200
        fake.stamp = int((started - before) * 1e6)
        s0, _ = inv.sample()
        assert os.getpid() not in s0.processes  # nor in the running list: PID 1000 is
    # Stamped after it started, or within a clock tick's error of its start: its own.
    for stamp in (time.time(), started - 0.01):
        fake.stamp = int(stamp * 1e6)
        s0, _ = inv.sample()
        assert s0.processes == {1000: 0.0, os.getpid(): 0.7}
    # A PID this host cannot see (another namespace, or gone) keeps NVML's word.
    fake.busy_pid, fake.stamp = 2**22 + 7, 5
    s0, _ = inv.sample()
    assert s0.processes[2**22 + 7] == 0.7
    inv.close()
