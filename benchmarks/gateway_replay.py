"""Kueue's scheduler baseline replayed through a real gateway, on the wall clock (issue 15).

Kueue's 351 s for its 15,000-request baseline is real time against an API server; the
`kueue_baseline.py` number is a virtual clock. This compares like with like: the same
scenario (`kueue_baseline.build()`: 5 cohorts x 6 tenants, nominal 20 GPUs, borrowing
limit 100, reclaimWithinCohort Any, withinClusterQueue LowerPriority; 350 small, 100
medium, 50 large jobs per tenant) through a `jupyter-gpuaas gateway` subprocess:

- SQLite store (a temporary file), REST over loopback, `--devices simulated:gpu=30x20`
  (600 GPUs, the scenario's one flavor), the quota file made of the scenario's
  `flavors` and `tenants`, a token file with one user per tenant (`c0t0-user`, ...),
  `--lease-ttl 0` (the holders below do not heartbeat; their jobs last ~1 s).
- Open loop: each request is POSTed at its trace time after the common start, whatever
  happened to the ones before it, by its tenant's user, as a `job` with its priority.
- Its holder learns of its admission from SSE (`api/events`, one listener per user: a
  user hears exactly the events about its own requests), or from the submit's answer if
  it was admitted at once, whichever comes first; it runs its duration from then on and
  releases it (`DELETE`). A `preempt` event stops its clock; the gateway requeues a
  preempted job, and on its next `admit` the holder runs the whole duration again (as
  the simulator does and as a restarted Kueue Job does). When its `DELETE` reaches the
  gateway after a preemption it has not heard of yet, the gateway cancels the requeued
  request: the holder submits the job again (`resubmitted_after_race`), so a request
  counts as done only once a run of it ends in a release.

Measured: the wall time from the start to the last release; the quota-bound floor (total
GPU-seconds of the trace / GPUs: no schedule can finish sooner, about 66 s) and their
ratio; requests admitted; lost ones (accepted but never admitted, or never released by
the end, or any error); the submit latency (from the scheduled instant to the answer's
last byte, so a late generator shows as latency too); admit-to-holder latency (the admit
decision's `t`, as stored and sent in the event, to the holder's receipt of it). From the
store, `gpu_seconds` says where the time above the floor went: GPU-seconds held (admit to
release, as decided), of which runs cut short by preemption, and the holders' slack
(hearing of an admission, releasing) beyond the trace's own GPU-seconds.

The load generator may run as several processes (`--procs`, tenants dealt round-robin);
everything shares the machine's CPUs with the gateway (say so when quoting numbers).
Parsing is kept cheap: an event's name, `t` and `id` are read without decoding its JSON.

    .venv/bin/python benchmarks/gateway_replay.py [--scale 1.0] [--procs 2] [--nice N] [--json]

`--scale 0.02` shrinks every tenant's counts (7 small, 2 medium, 1 large) for a smoke test.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _bench
import _replay
import gateway_load as gl
import kueue_baseline
import yaml

TARGET_RATIO = 1.2
KUEUE_RATIO = 5.3  # Kueue's 351 s against the same floor (issue 15)
FLAVOR = "gpu"


def floor_s(doc: dict[str, Any]) -> float:
    """Total GPU-seconds of the trace over the GPUs there are: the quota-bound floor."""
    gpus = sum(f["nodes"] * f["gpus_per_node"] for f in doc["flavors"].values())
    return sum(r["gpus"] * r["duration"] for r in doc["requests"]) / gpus


def write_config(tmp: Path, doc: dict[str, Any]) -> tuple[Path, Path]:
    """The quota file (the scenario's flavors and tenants) and a token file, one user a
    tenant (the request's `user`)."""
    quotas = {"flavors": doc["flavors"], "tenants": doc["tenants"]}
    tokens: dict[str, Any] = {}
    for r in doc["requests"]:
        tokens.setdefault(gl.token_of(r["user"]), {"user": r["user"], "groups": [r["tenant"]]})
    q, t = tmp / "quotas.yaml", tmp / "tokens.yaml"
    q.write_text(yaml.safe_dump(quotas, sort_keys=False))
    t.write_text(yaml.safe_dump({"tokens": tokens}))
    return q, t


def start_gateway(
    tmp: Path, doc: dict[str, Any], extra: list[str]
) -> tuple[subprocess.Popen[bytes], int, Path]:
    q, t = write_config(tmp, doc)
    port = gl.free_port()
    db = tmp / "gpuaas.sqlite"
    log = tmp / "gateway.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for k in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_NAME"):
        env.pop(k, None)
    devices = ",".join(
        f"{name}={f['nodes']}x{f['gpus_per_node']}" for name, f in doc["flavors"].items()
    )
    argv = [
        sys.executable,
        "-m",
        "jupyter_gpuaas.gateway.app",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--quotas={q}",
        f"--tokens={t}",
        f"--devices=simulated:{devices}",
        f"--db-url=sqlite:///{db}",
        "--lease-ttl=0",
        "--GatewayApp.max_queued_per_user=0",  # one user a tenant queues the whole trace
        *extra,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1):
                return proc, port, db
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"gateway did not start:\n{log.read_text()[-3000:]}")


# --------------------------------------------------------------------------- main


def store_counts(db: Path) -> dict[str, int]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT event, count(*) FROM decisions GROUP BY event").fetchall()
    finally:
        con.close()
    return {str(e): int(n) for e, n in rows}


def held_gpu_seconds(db: Path, trace_gpu_s: float, capacity_gpu_s: float) -> dict[str, float]:
    """Where the time beyond the floor went, from the store: GPU-seconds held (admit to
    release, as decided), of which runs cut short by preemption; the rest of what was
    held beyond the trace's own GPU-seconds is the holders' slack (hearing of the
    admission, releasing)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT d.request_id, d.event, d.t, r.gpus FROM decisions d JOIN requests r"
            " ON r.id = d.request_id WHERE d.event IN ('admit', 'finish', 'cancel', 'preempt')"
            " ORDER BY d.seq"
        ).fetchall()
    finally:
        con.close()
    since: dict[str, float] = {}
    held = cut = 0.0
    for rid, event, t, gpus in rows:
        if event == "admit":
            since[rid] = float(t)
        elif rid in since:
            span = gpus * (float(t) - since.pop(rid))
            held += span
            if event == "preempt":
                cut += span
    return {
        "trace_gpu_s": round(trace_gpu_s, 1),
        "held_gpu_s": round(held, 1),
        "cut_by_preemption_gpu_s": round(cut, 1),
        "holder_slack_gpu_s": round(held - cut - trace_gpu_s, 1),
        "capacity_gpu_s": round(capacity_gpu_s, 1),  # GPUs x wall time
    }


def replay(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    doc = kueue_baseline.build(scale=args.scale)
    floor = floor_s(doc)
    timeout = args.timeout if args.timeout else max(60.0, 4 * floor)
    shares: list[list[dict[str, Any]]] = [[] for _ in range(args.procs)]
    tenants = list(doc["tenants"])
    for r in doc["requests"]:
        shares[tenants.index(r["tenant"]) % args.procs].append(r)
    load0 = os.getloadavg()
    proc, port, db = start_gateway(tmp, doc, args.gateway_arg)
    ctx = mp.get_context("fork")
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    children = [
        ctx.Process(
            target=_replay.child, args=(port, share, args.connections, ready, go, out, timeout + 30)
        )
        for share in shares
    ]
    try:
        for c in children:
            c.start()
        listeners = [ready.get(timeout=120) for _ in children]
        if min(listeners) < 0:
            raise SystemExit(f"a generator failed to connect: {out.get(timeout=5)}")
        cpu0 = gl.cpu_seconds(proc.pid)
        sys0, at0 = gl.system_cpu()
        start_epoch = time.time() + 0.5
        for _ in children:
            go.put(start_epoch)
        results = [out.get(timeout=timeout + 120) for _ in children]
        gateway_cpu = gl.cpu_seconds(proc.pid) - cpu0
        sys1, at1 = gl.system_cpu()
        status = gl.proc_status(proc.pid)
    finally:
        for c in children:
            c.join(10)
            if c.is_alive():
                c.kill()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    load1 = os.getloadavg()
    crashed = [r["crashed"] for r in results if "crashed" in r]
    if crashed:
        raise SystemExit(f"a generator crashed: {crashed}")

    def merged(key: str) -> list[float]:
        return [x for r in results for x in r[key]]

    def total(key: str) -> int:
        return sum(int(r[key]) for r in results)

    errors: dict[str, int] = {}
    for r in results:
        for k, n in r["errors"].items():
            errors[k] = errors.get(k, 0) + n
    requests = total("requests")
    # The last release, when every request was released; else the time given up at.
    done_all = total("unreleased") + total("never_admitted") == 0
    last = max(r["last_release"] for r in results)
    wall = (last - start_epoch) if done_all and last else timeout
    used = [(b - a) / (at1 - at0) for a, b in zip(sys0, sys1, strict=True)]
    submit, notify = merged("submit_ms"), merged("notify_ms")
    lost = total("lost")
    counts = store_counts(db)
    gpus_total = sum(f["nodes"] * f["gpus_per_node"] for f in doc["flavors"].values())
    gpu_s = held_gpu_seconds(db, floor * gpus_total, gpus_total * wall)
    result = {
        "benchmark": "gateway_replay",
        "command": " ".join(["benchmarks/gateway_replay.py", *sys.argv[1:]]),
        "machine": _bench.machine(),
        "load_average_start": [round(x, 2) for x in load0],
        "load_average_end": [round(x, 2) for x in load1],
        "scale": args.scale,
        "procs": args.procs,
        "nice": args.nice,
        "requests": requests,
        "tenants": len(doc["tenants"]),
        "gpus": sum(f["nodes"] * f["gpus_per_node"] for f in doc["flavors"].values()),
        "wall_s": round(wall, 2),
        "floor_s": round(floor, 2),
        "ratio": round(wall / floor, 3),
        "target_ratio": TARGET_RATIO,
        "kueue_ratio": KUEUE_RATIO,
        "admitted": total("admitted"),
        "lost": lost,
        "never_admitted": total("never_admitted"),
        "unreleased": total("unreleased"),
        "errors": errors,
        # the holder's DELETE met a preemption it had not heard of yet: submitted again
        "resubmitted_after_race": total("raced"),
        "preemptions_heard": total("preempted"),
        "runs": total("runs"),
        "submit_p50_ms": round(gl.pct(submit, 50), 1),
        "submit_p99_ms": round(gl.pct(submit, 99), 1),
        "submit_max_ms": round(max(submit, default=0.0), 1),
        "release_p99_ms": round(gl.pct(merged("release_ms"), 99), 1),
        "admit_notify_p50_ms": round(gl.pct(notify, 50), 1),
        "admit_notify_p99_ms": round(gl.pct(notify, 99), 1),
        "preempt_notify_p99_ms": round(gl.pct(merged("preempt_notify_ms"), 99), 1),
        "listeners": sum(listeners),
        "listeners_closed": total("listeners_closed"),
        "connections_opened": total("connections_opened"),
        "gateway_cpu_s": round(gateway_cpu, 1),
        "generator_cpu_s": round(sum(float(r["cpu_s"]) for r in results), 1),
        # CPU seconds per second of the run, over all the machine's cores: how much of
        # it this gateway and generator had, and how much other work took meanwhile
        "machine_cpu_share": {
            "gateway": round(gateway_cpu / (at1 - at0), 2),
            "others_and_generator": round(
                sum(used) - used[3] - used[4] - gateway_cpu / (at1 - at0), 2
            ),
            "idle": round(used[3] + used[4], 2),
            "steal": round(used[7], 2),
        },
        "gateway_peak_rss_mib": round(status["VmHWM"] / 1024, 1),
        "store_decisions": counts,
        "gpu_seconds": gpu_s,
    }
    result["pass"] = result["ratio"] <= TARGET_RATIO and lost == 0
    return result


def text(r: dict[str, Any]) -> str:
    return (
        f"Kueue baseline through a real gateway: {r['requests']:,} requests, {r['tenants']}"
        f" tenants, {r['gpus']} simulated GPUs, {r['procs']} generator process(es)\n"
        f"  command     {r['command']}\n"
        f"  wall        {r['wall_s']:.1f} s; floor {r['floor_s']:.1f} s; ratio {r['ratio']:.2f}"
        f" (target <= {r['target_ratio']}, Kueue {r['kueue_ratio']}):"
        f" {'PASS' if r['pass'] else 'FAIL'}\n"
        f"  admitted    {r['admitted']:,}; lost {r['lost']} (never admitted"
        f" {r['never_admitted']}, unreleased {r['unreleased']}, errors {r['errors']});"
        f" preemptions {r['preemptions_heard']}\n"
        f"  submit      p50 {r['submit_p50_ms']} ms, p99 {r['submit_p99_ms']} ms,"
        f" max {r['submit_max_ms']} ms\n"
        f"  admit heard p50 {r['admit_notify_p50_ms']} ms, p99 {r['admit_notify_p99_ms']} ms\n"
        f"  CPU         gateway {r['gateway_cpu_s']} s, generator {r['generator_cpu_s']} s;"
        f" gateway peak RSS {r['gateway_peak_rss_mib']} MiB\n"
        f"  load avg    {r['load_average_start']} at start, {r['load_average_end']} at end;"
        f" machine CPU share {r['machine_cpu_share']} (nice {r['nice']})\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="shrink every tenant's counts")
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    p.add_argument("--connections", type=int, default=8, help="keep-alive connections each")
    p.add_argument("--timeout", type=float, default=0.0, help="give up after S (0: 4 x floor)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="scheduling niceness of the gateway and the generators (negative needs root): "
        "on a shared machine, keeps other work from taking the CPU from them",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (db, gateway log)")
    p.add_argument(
        "--gateway-arg", action="append", default=[], help="extra gateway flag (repeatable)"
    )
    args = p.parse_args(argv)
    if args.procs < 1 or args.scale <= 0:
        p.error("--procs must be >= 1 and --scale > 0")
    tmp = Path(tempfile.mkdtemp(prefix="gw-replay-"))
    restore_autogroup = gl.prioritize(args.nice)  # the gateway and generators inherit it
    try:
        result = replay(args, tmp)
    finally:
        restore_autogroup()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    _bench.emit(result, args.json, text(result))
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
