"""What the real-GPU tests share: how many GPUs NVML sees, and the child processes.

The children stand in for a kernel launched with a grant. `CUDA_CHILD` asks the CUDA
driver itself (libcuda through ctypes: no torch needed) which devices it shows, since NVML
ignores CUDA_VISIBLE_DEVICES; `BURNER` keeps its device busy with matrix products (torch
or cupy), or, with "idle", holds a context on it and computes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from jupyter_gpuaas.client import launch_environment


def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


# The child: which devices does the CUDA driver show it? One JSON line: the 8-4-4-4-12
# hex of each visible device's UUID (cuDeviceGetUuid_v2 gives a MIG instance's own), in
# CUDA's order. With "hold" it also makes a context on device 0 and waits to be killed.
CUDA_CHILD = r"""
import ctypes, json, sys, time
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(json.dumps({"skip": f"no libcuda: {e}"}), flush=True)
    sys.exit(0)

def check(result, what):
    if result != 0:
        print(json.dumps({"error": f"{what} answered CUresult {result}"}), flush=True)
        sys.exit(1)

check(cuda.cuInit(0), "cuInit")
count = ctypes.c_int()
check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
uuids = []
for ordinal in range(count.value):
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    raw = (ctypes.c_char * 16)()
    check(get_uuid(raw, dev), "cuDeviceGetUuid")
    h = bytes(raw).hex()
    uuids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
if sys.argv[1:] == ["hold"] and uuids:
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)), "cuMemAlloc")
print(json.dumps({"uuids": uuids}), flush=True)
if sys.argv[1:] == ["hold"]:
    time.sleep(60)
"""


def child_env(grant: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NVIDIA_"))}
    return {**env, **launch_environment(grant)}


def seen_by_child(grant: dict[str, Any]) -> list[str]:
    p = subprocess.run(
        [sys.executable, "-c", CUDA_CHILD],
        env=child_env(grant),
        capture_output=True,
        text=True,
        timeout=120,
    )
    answer = json.loads(p.stdout.strip().splitlines()[-1])
    if "skip" in answer:
        pytest.skip(answer["skip"])
    assert p.returncode == 0 and "error" not in answer, (answer, p.stderr)
    return list(answer["uuids"])


BURNER = """
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
sync()
print("ready", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    if sys.argv[3:] == ["idle"]:
        time.sleep(0.5)
        continue
    for _ in range(20):
        step()
    sync()
"""


def array_library() -> str | None:
    """torch or cupy, whichever imports here, to load a GPU with; None: neither."""
    import importlib.util

    return next((m for m in ("torch", "cupy") if importlib.util.find_spec(m)), None)
