"""What a holder's submit costs our gateway in Kueue mode as live requests pile up
(issue 42: the side-by-side's `kueue_mode` column fell behind at thousands of them).

On the real control plane (scripts/cluster.py, Kueue 0.19.2), as the side-by-side's
`--workloads` feeds the gateway: per request, a holder's `POST api/requests` (kind job,
1 GPU), then a Workload made directly in its tenant's LocalQueue with the holder's
`kueue_labels` (the request's id), which the gateway binds to the intent. Nothing
finishes: each tenant's small quota (`--quota` GPUs, no borrowing) is soon full, so the
requests stay live, nearly all pending in Kueue with positions from its visibility API
(the heaviest state for the gateway: every pending Workload has a position to keep).

Reported per window of `--step` submits, against the live requests at its start: the
submits' latency p50/p95 (the holder's POST, what it waits for), submits a second, and
the gateway's CPU milliseconds per submit (its process's CPU time over the window: the
POST, the Workload watch's events it brings, and the positions asked again after them).

    PYTHONPATH=$PWD/.. ../.venv/bin/python kueue_submit_cost.py --cluster-dir ../.cluster \
        [--live 3000] [--step 500] [--tenants 6] [--quota 2] [--at-once 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench
import kueue_side_by_side as sbs
from gateway_load import cpu_seconds, machine


def scenario(tenants: int, quota: int, live: int) -> dict[str, Any]:
    """`tenants` tenants of one cohort, `quota` GPUs each and no borrowing; `live`
    requests of 1 GPU, dealt round-robin."""
    names = [f"t{i}" for i in range(tenants)]
    return {
        "flavors": {sbs.FLAVOR: {"nodes": 1, "gpus_per_node": 20}},
        "tenants": {
            t: {"cohort": "c0", "quota": {sbs.FLAVOR: quota}, "borrowing_limit": {sbs.FLAVOR: 0}}
            for t in names
        },
        "requests": [
            {
                "id": f"r{i}",
                "tenant": names[i % tenants],
                "user": names[i % tenants],
                "kind": "job",
                "gpus": 1,
                "priority": 50,
                "submit": 0.0,
                "duration": 1.0,
            }
            for i in range(live)
        ],
    }


async def _fill(
    kubeconfig: Path, url: str, ns: str, data: dict[str, Any], pid: int, step: int, at_once: int
) -> list[dict[str, Any]]:
    from kubernetes_asyncio import client, config

    from jupyter_gpuaas.client import GatewayClient
    from jupyter_gpuaas.kubernetes.pods import kueue_labels

    await config.load_kube_config(config_file=str(kubeconfig))
    api = client.ApiClient()
    custom = client.CustomObjectsApi(api)
    holders = {t: GatewayClient(url, sbs._token(t)) for t in data["tenants"]}
    requests = data["requests"]
    sem = asyncio.Semaphore(at_once)
    errors: list[str] = []

    async def one(i: int, req: dict[str, Any], lat: list[float]) -> None:
        async with sem:
            t0 = time.perf_counter()
            try:
                made = await holders[req["tenant"]].submit(
                    req["tenant"], "job", req["gpus"], sbs.FLAVOR, req["priority"], name=req["id"]
                )
            except Exception as e:
                errors.append(f"submit {req['id']}: {e}")
                return
            lat.append(time.perf_counter() - t0)
            labels = kueue_labels(
                req["tenant"],
                user=req["tenant"],
                kind="job",
                priority_class=f"sbs-p{req['priority']}",
                request=made["id"],
            )
            try:
                await custom.create_namespaced_custom_object(
                    sbs.KUEUE_GROUP,
                    sbs.KUEUE_VERSION,
                    ns,
                    "workloads",
                    sbs._workload(ns, f"w{i}", req, labels),
                )
            except Exception as e:
                errors.append(f"workload {req['id']}: {e}")

    windows = []
    try:
        for start in range(0, len(requests), step):
            lat: list[float] = []
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            chunk = requests[start : start + step]
            await asyncio.gather(*(one(start + k, r, lat) for k, r in enumerate(chunk)))
            wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
            windows.append(
                {
                    "live_at_start": start,
                    "submits": len(lat),
                    "submits_per_s": round(len(lat) / wall, 1),
                    "latency_p50_ms": round(_bench.percentile(lat, 50) * 1000, 1),
                    "latency_p95_ms": round(_bench.percentile(lat, 95) * 1000, 1),
                    "gateway_cpu_ms_per_submit": round(cpu * 1000 / max(1, len(lat)), 1),
                    "errors": len(errors),
                    "load_average_1m": round(os.getloadavg()[0], 1),
                }
            )
            print(json.dumps(windows[-1]), file=sys.stderr, flush=True)
    finally:
        await api.close()
    return windows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster-dir", type=Path, required=True, help="a running cluster")
    parser.add_argument("--live", type=int, default=3000, help="requests submitted in all")
    parser.add_argument("--step", type=int, default=500, help="submits per window")
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--quota", type=int, default=2, help="GPUs per tenant")
    parser.add_argument("--at-once", type=int, default=8, help="submits in flight")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = scenario(args.tenants, args.quota, args.live)
    with (
        sbs._on_cluster(data, args.cluster_dir, wait=True) as (cluster, ns, named),
        tempfile.TemporaryDirectory(prefix="submit-cost-") as tmp,
    ):
        proc, url = sbs._start_gateway(Path(tmp), cluster.kubeconfig, ns, named)
        try:
            windows = asyncio.run(
                _fill(cluster.kubeconfig, url, ns, named, proc.pid, args.step, args.at_once)
            )
        finally:
            proc.terminate()
            proc.wait(30)
    out = {
        "machine": machine(),
        "args": vars(args) | {"cluster_dir": str(args.cluster_dir)},
        "windows": windows,
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for w in windows:
            print(
                f"live {w['live_at_start']:>6}: {w['submits_per_s']:>6} submits/s, "
                f"p50 {w['latency_p50_ms']} ms, p95 {w['latency_p95_ms']} ms, "
                f"gateway {w['gateway_cpu_ms_per_submit']} CPU ms/submit"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
