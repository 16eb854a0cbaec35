"""What NVML's per-process utilization says, window by window, on a real GPU.

A process computes matrix products for 6 s, then one that holds a context and computes
nothing; every 0.5 s for 4 s of each it prints NVML's raw per-process samples since the
last one seen (PID, timeStamp in µs, SM and memory share, the process's start time as
`jupyter_gpuaas.devices.nvml.process_start` reads it) and the device's utilization. Needs
an NVIDIA GPU and torch. Run from the repository root:

    python benchmarks/nvml_windows.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from gpuutil import BURNER

from jupyter_gpuaas.devices.nvml import process_start

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)


def rows(last: int) -> Any:
    try:
        return pynvml.nvmlDeviceGetProcessUtilization(h, last)
    except pynvml.NVMLError as e:
        return str(e)


def _row(x: Any) -> str:
    started = int((process_start(x.pid) or 0) * 1e6)
    return f"pid {x.pid} ts {x.timeStamp} sm {x.smUtil} mem {x.memUtil} started {started}"


for mode in ([], ["idle"]):
    p = subprocess.Popen(
        [sys.executable, "-c", BURNER, "torch", "6", *mode], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    print("start", mode or "busy", "pid", p.pid, p.stdout.readline().strip(), flush=True)
    last = 0
    t0 = time.time()
    while time.time() - t0 < 4:
        r = rows(last)
        if isinstance(r, str):
            print(f"  +{time.time() - t0:.1f}s last={last}: {r}")
        else:
            print(f"  +{time.time() - t0:.1f}s last={last}: " + ", ".join(_row(x) for x in r))
            last = max([last] + [int(x.timeStamp) for x in r])
        util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
        print(f"    device util {util}%  now_us {int(time.time() * 1e6)}", flush=True)
        time.sleep(0.5)
    p.kill()
    p.wait()
pynvml.nvmlShutdown()
