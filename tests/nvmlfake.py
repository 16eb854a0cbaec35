"""A fake NVML library: just the pynvml functions NvmlInventory calls, over a made-up host.

It is a test double, not NVML: a host is a list of `FakeGpu`s, and each function answers
from it the way nvidia-ml-py documents (NotSupported for MIG mode on a model without MIG
and for utilization of a MIG instance, NotFound for an empty MIG slot). The error classes
and constants are the real pynvml's, so `except pynvml.NVMLError_NotFound` in the code
under test catches what this raises.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

GiB = 1024**3


@dataclass
class FakeMig:
    slot: int  # its index among the GPU's MIG slots (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str
    profile: str  # "1g.10gb"
    memory: int
    name_has_profile: bool = True  # False: only nvmlDeviceGetAttributes tells the profile
    slices: int = 1


@dataclass
class FakeGpu:
    name: str
    uuid: str
    memory: int
    mig_capable: bool = False
    mig_on: bool = False
    migs: list[FakeMig] = field(default_factory=list)
    utilization: int = 0  # percent
    pids: list[int] = field(default_factory=list)
    process_utilization: dict[int, int] = field(default_factory=dict)  # pid → SM percent


@dataclass(frozen=True)
class Handle:
    gpu: int
    mig_slot: int | None = None


class FakeNvml:
    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.shutdowns = 0
        self.clock = 0  # timestamps of per-process samples

    # --- the library ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return Handle(i)

    def _gpu(self, h: Handle) -> FakeGpu:
        return self.gpus[h.gpu]

    def _mig(self, h: Handle) -> FakeMig | None:
        if h.mig_slot is None:
            return None
        return next(m for m in self._gpu(h).migs if m.slot == h.mig_slot)

    # --- identity ------------------------------------------------------------------

    def nvmlDeviceGetName(self, h: Handle) -> str:
        mig = self._mig(h)
        if mig is None:
            return self._gpu(h).name
        return f"{self._gpu(h).name} MIG {mig.profile}" if mig.name_has_profile else "MIG"

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        mig = self._mig(h)
        return mig.uuid if mig else self._gpu(h).uuid

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Any:
        mig = self._mig(h)
        total = mig.memory if mig else self._gpu(h).memory
        return argparse.Namespace(total=total, used=total // 8, free=total - total // 8)

    # --- MIG -----------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        gpu = self._gpu(h)
        if not gpu.mig_capable or h.mig_slot is not None:
            raise pynvml.NVMLError_NotSupported()
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_on else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        gpu = self._gpu(h)
        return 7 if gpu.mig_capable and gpu.mig_on else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, index: int) -> Handle:
        gpu = self._gpu(h)
        if not gpu.mig_on or index >= 7:
            raise pynvml.NVMLError_InvalidArgument()
        if not any(m.slot == index for m in gpu.migs):
            raise pynvml.NVMLError_NotFound()
        return Handle(h.gpu, index)

    def nvmlDeviceGetAttributes(self, h: Handle) -> Any:
        mig = self._mig(h)
        if mig is None:
            raise pynvml.NVMLError_NotSupported()
        return argparse.Namespace(
            gpuInstanceSliceCount=mig.slices,
            computeInstanceSliceCount=mig.slices,
            memorySizeMB=mig.memory // 1024**2,
        )

    # --- samples -------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        if h.mig_slot is not None:
            raise pynvml.NVMLError_NotSupported()  # as on real MIG instances
        return argparse.Namespace(gpu=self._gpu(h).utilization, memory=0)

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        if h.mig_slot is not None:
            raise pynvml.NVMLError_NotSupported()
        return 40 + h.gpu

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        if h.mig_slot is not None:
            raise pynvml.NVMLError_NotSupported()
        return 100_000 + 1000 * h.gpu  # mW

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        if h.mig_slot is not None:
            return []
        return [argparse.Namespace(pid=p, usedGpuMemory=GiB) for p in self._gpu(h).pids]

    def nvmlDeviceGetProcessUtilization(self, h: Handle, since: int) -> list[Any]:
        gpu = self._gpu(h)
        if h.mig_slot is not None:
            raise pynvml.NVMLError_NotSupported()  # as on real MIG instances
        if not gpu.process_utilization:
            raise pynvml.NVMLError_NotFound()  # no samples since `since`
        # Every call sees a new window, stamped as NVML does (µs since the epoch).
        self.clock = max(self.clock + 1, int(time.time() * 1e6))
        return [
            argparse.Namespace(pid=pid, smUtil=util, memUtil=0, timeStamp=self.clock)
            for pid, util in gpu.process_utilization.items()
        ]


def mixed_host() -> FakeNvml:
    """2× A100 (the second in MIG mode with two 1g.10gb instances, in slots 0 and 3) and a
    T4, in that NVML order."""
    return FakeNvml(
        [
            FakeGpu(
                "NVIDIA A100-SXM4-80GB",
                "GPU-a1000000-0000-0000-0000-000000000000",
                80 * GiB,
                mig_capable=True,
                utilization=30,
            ),
            FakeGpu(
                "NVIDIA A100-SXM4-80GB",
                "GPU-a1000001-0000-0000-0000-000000000001",
                80 * GiB,
                mig_capable=True,
                mig_on=True,
                migs=[
                    FakeMig(0, "MIG-a1000001-0000-0000-0000-00000000m100", "1g.10gb", 9728 * 2**20),
                    FakeMig(
                        3,
                        "MIG-a1000001-0000-0000-0000-00000000m103",
                        "1g.10gb",
                        9728 * 2**20,
                        name_has_profile=False,  # the profile from the attributes instead
                    ),
                ],
            ),
            FakeGpu(
                "Tesla T4",
                "GPU-74000002-0000-0000-0000-000000000002",
                15360 * 2**20,
                utilization=80,
                pids=[4242],
            ),
        ]
    )
