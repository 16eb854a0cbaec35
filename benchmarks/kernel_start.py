"""Kernel start time with the `gpuaas` provisioner (a free GPU: admitted at once) against
the plain local provisioner, side by side in one run.

A real gateway subprocess (`jupyter-gpuaas gateway`, simulated devices: one a100) and two
kernelspecs for the same Python (ipykernel): `plain` (LocalProvisioner) and `gpu` (gpuaas,
1 GPU). Each round starts one kernel of each (interleaved, so machine noise hits both
alike) with jupyter_client's AsyncKernelManager and times start_kernel() until the kernel
answers kernel_info (ready to run code); then shuts both down (the GPU kernel's shutdown
releases the grant, so the next round finds the GPU free again). One warm-up round is not
counted. Target: the gpuaas median is at most 100 ms slower than the plain one.

    .venv/bin/python benchmarks/kernel_start.py [--rounds 10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGET_MS = 100.0
TOKEN = "bench-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    import yaml

    quotas = tmp / "quotas.yaml"
    quotas.write_text(
        yaml.safe_dump(
            {
                "flavors": {"a100": {"nodes": 1, "gpus_per_node": 1}},
                "tenants": {"vision": {"quota": {"a100": 1}}},
                "policy": {"idle_timeout": 0},
            }
        )
    )
    tokens = tmp / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": {TOKEN: {"user": "bench", "groups": ["vision"]}}}))
    port = free_port()
    exe = Path(sys.executable).parent / "jupyter-gpuaas"
    argv = [
        str(exe),
        "gateway",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--db-url=sqlite:///{tmp / 'gpuaas.sqlite'}",
        f"--quotas={quotas}",
        f"--tokens={tokens}",
        "--devices=simulated:a100=1x1",
    ]
    log = open(tmp / "gateway.log", "wb")  # noqa: SIM115 (lives as long as the gateway)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "api/openapi.json", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit((tmp / "gateway.log").read_text()[-2000:]) from None
            time.sleep(0.05)


def write_specs(data_dir: Path) -> None:
    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    kernels = data_dir / "kernels"
    write_spec(kernels / "gpu", gpus=1, flavor="a100")
    plain = kernels / "plain"
    write_spec(plain, gpus=1)
    spec = json.loads((plain / "kernel.json").read_text())
    del spec["metadata"]["kernel_provisioner"]
    (plain / "kernel.json").write_text(json.dumps(spec))


async def time_start(name: str) -> tuple[float, Any]:
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name=name)
    started = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    elapsed = time.perf_counter() - started
    kc.stop_channels()
    return elapsed, km


async def run(rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"plain": [], "gpu": [], "acquire": []}
    for i in range(rounds + 1):  # round 0 warms up caches (imports, tenants lookup)
        for name in ("plain", "gpu") if i % 2 == 0 else ("gpu", "plain"):
            elapsed, km = await time_start(name)
            if name == "gpu":
                record = km.provisioner.record
                assert record.devices == [0], "the GPU kernel was not admitted"
                if i > 0:
                    times["acquire"].append(record.waited)
            await km.shutdown_kernel(now=False)
            if i > 0:
                times[name].append(elapsed)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        proc, url = start_gateway(tmp)
        try:
            os.environ.update(
                {
                    "GPUAAS_URL": url,
                    "GPUAAS_TOKEN": TOKEN,
                    "JUPYTER_DATA_DIR": str(tmp / "data"),
                    "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
                }
            )
            write_specs(tmp / "data")
            times = asyncio.run(run(args.rounds))
        finally:
            proc.terminate()
            proc.wait(10)
    plain = statistics.median(times["plain"]) * 1000
    gpu = statistics.median(times["gpu"]) * 1000
    acquire = statistics.median(times["acquire"]) * 1000
    result = {
        "rounds": args.rounds,
        "plain_median_ms": round(plain, 1),
        "gpuaas_median_ms": round(gpu, 1),
        "overhead_ms": round(gpu - plain, 1),
        # The provisioner's own added step (submit until admitted), free of launch noise.
        "acquire_median_ms": round(acquire, 1),
        "target_ms": TARGET_MS,
        "pass": gpu - plain <= TARGET_MS,
        "plain_ms": [round(t * 1000, 1) for t in times["plain"]],
        "gpuaas_ms": [round(t * 1000, 1) for t in times["gpu"]],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"kernel start, median of {args.rounds}: plain {plain:.1f} ms, gpuaas {gpu:.1f} ms, "
            f"overhead {gpu - plain:+.1f} ms (target <= {TARGET_MS:.0f} ms; the submit-to-"
            f"admission step alone: {acquire:.1f} ms): "
            f"{'PASS' if result['pass'] else 'FAIL'}"
        )
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
