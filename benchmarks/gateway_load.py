"""Gateway under load (issue 3): open-loop submissions, 500 SSE listeners, release latency.

Starts a real `jupyter-gpuaas gateway` subprocess (temporary SQLite store in WAL mode with
synchronous=FULL, simulated devices, a token file of 16 users in 4 tenants plus 2 viewers),
then from THIS process, over loopback:

1. opens `--listeners` SSE streams on `api/events` (90% spread over the 16 users, 10% by
   the two users with view rights, who hear every decision);
2. submits at a steady `--rate` per second for `--duration` seconds, open loop: request i
   is scheduled at start + i/rate and sent then whatever happened to the ones before it;
   its latency is measured from that scheduled instant to the last byte of the answer, so
   a stalled gateway (or a stalled load generator) shows up as latency, not as a lower
   rate. Each accepted request is cancelled (`DELETE`, by its owner) after a random
   lifetime of 1-9 s, so the live set stays near rate x 5 s instead of growing without
   bound; a cancel of an admitted request is a release that admits the next in line.
   16 a100 GPUs against ~1,000 live 1-2 GPU requests: almost every submission queues;
3. reads the gateway's peak RSS (VmHWM of /proc/<pid>/status) and counts SSE deliveries
   against the decision log (every listener must receive every decision it may see);
4. release to next admission: on a 1-GPU h100 node, a holder and a queued waiter; the
   holder is DELETEd and the clock runs until the waiter's `admit` event reaches the
   waiter's own SSE listener (the 500 listeners stay connected). `--probes` times.

`--history N` first fills the store with N ended requests (finished, cancelled or
rejected, over the last 20 days, one decision each) so the run meets a grown history;
`--list-rate R` adds R open-loop `GET api/requests?limit=50` per second, each by a random
user (their own list: the `(user, created)` index), timed like the submissions.

Errors are any non-2xx answer or a connection error. Everything runs on one machine: the
load generator shares the CPUs with the gateway (say so when quoting the numbers).
`--listener-process` opens the listeners in a child process (_sse_crowd.py) instead of
this one, so that reading many streams does not delay the submissions being timed.

    .venv/bin/python benchmarks/gateway_load.py [--quick] [--duration S] [--rate N]
        [--listeners N] [--probes N] [--history N] [--list-rate R] [--json FILE]

`--quick` is 5 s at 50/s with 50 listeners and 5 probes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Run as a script, benchmarks/ is sys.path[0]: the siblings import as top-level modules.
from _load_client import SSE, open_listener, quiet
from _load_client import Pool as Pool  # re-exported: _replay.py uses gl.Pool
from _load_store import TENANTS, expected_deliveries, last_seq, prefill, users
from _load_store import token_of as token_of  # re-exported: gateway_replay.py, _replay.py

TARGETS = {
    "submit_p99_ms": 50.0,
    "errors": 0,
    "rss_mib": 300.0,
    "release_to_admit_ms": 100.0,
}

VIEWERS = ("viewer0", "viewer1")
PROBE = "probe"


# --------------------------------------------------------------------------- setup


def write_config(tmp: Path) -> tuple[Path, Path]:
    quotas = {
        "flavors": {
            "a100": {"nodes": 2, "gpus_per_node": 8},
            "h100": {"nodes": 1, "gpus_per_node": 1},
        },
        "tenants": {
            **{t: {"quota": {"a100": 4}} for t in TENANTS},
            PROBE: {"quota": {"h100": 1}},
        },
    }
    tokens: dict[str, Any] = {}
    for user, tenant in users():
        tokens[token_of(user)] = {"user": user, "groups": [tenant]}
    for user in VIEWERS:
        tokens[token_of(user)] = {"user": user, "groups": [], "view": True}
    tokens[token_of(PROBE)] = {"user": PROBE, "groups": [PROBE]}
    q, t = tmp / "quotas.yaml", tmp / "tokens.yaml"
    q.write_text(yaml.safe_dump(quotas, sort_keys=False))
    t.write_text(yaml.safe_dump({"tokens": tokens}))
    return q, t


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def system_cpu() -> tuple[list[float], float]:
    """(the machine's CPU seconds by kind: user, nice, system, idle, iowait, irq, softirq,
    steal; and the clock), from /proc/stat."""
    hz = os.sysconf("SC_CLK_TCK")
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    return [int(x) / hz for x in fields], time.perf_counter()


def prioritize(nice: int) -> Any:
    """Run this process (and the gateway it starts) at niceness `nice`; returns an undo.

    With autogroup scheduling (Linux desktops and many VMs) a process's nice value only
    counts within its session's group, and sessions share the CPUs equally: so the group's
    own nice value is set too (/proc/self/autogroup), and put back afterwards.
    """
    if not nice:
        return lambda: None
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    group = Path("/proc/self/autogroup")
    try:
        before = int(group.read_text().split("nice")[1])
        group.write_text(str(nice))
    except (OSError, ValueError, IndexError):
        return lambda: None

    def undo() -> None:
        try:
            group.write_text(str(before))
        except OSError:
            pass

    return undo


def start_gateway(
    tmp: Path, extra: list[str], nice: int = 0, history: int = 0
) -> tuple[subprocess.Popen[bytes], int, Path]:
    q, t = write_config(tmp)
    port = free_port()
    db = tmp / "gpuaas.sqlite"
    if history:
        prefill(db, history, seed=history)
    log = tmp / "gateway.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for k in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_NAME"):
        env.pop(k, None)
    argv = [
        sys.executable,
        "-m",
        "jupyter_gpuaas.gateway.app",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--quotas={q}",
        f"--tokens={t}",
        "--devices=simulated:a100=2x8,h100=1x1",
        f"--db-url=sqlite:///{db}",
        # ~1,000 live requests over 16 users: no per-user limit on the queue here.
        "--GatewayApp.max_queued_per_user=0",
        *extra,
    ]

    def lift() -> None:  # in the child: the same scheduling priority as the generator
        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)

    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp, preexec_fn=lift
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/openapi.json", timeout=1):
                return proc, port, db
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"gateway did not start:\n{log.read_text()[-3000:]}")


def scrape_streams(port: int) -> dict[str, float]:
    """gpuaas_event_streams{,_dropped_total} from the gateway's metrics (a viewer's token)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Authorization": f"token {token_of(VIEWERS[0])}"},
    )
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in ("gpuaas_event_streams", "gpuaas_event_streams_dropped_total"):
                    out[name] = float(value)
    except OSError as e:
        out["error"] = str(e)  # type: ignore[assignment]
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    ram = 0.0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            ram = int(line.split()[1]) / 1024 / 1024
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(ram, 1),
        "python": platform.python_version(),
    }


def server_times(log: Path) -> dict[str, list[float]]:
    """Tornado's own request_time (ms, headers read to answer written) per method, from
    the gateway's access log: how much of the latency was spent inside the gateway."""
    out: dict[str, list[float]] = {"POST": [], "DELETE": []}
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[-1].endswith("ms") and parts[-4] in out:
            try:
                out[parts[-4]].append(float(parts[-1][:-2]))
            except ValueError:
                pass
    return out


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


# --------------------------------------------------------------------------- the load


@dataclass
class Load:
    latencies: list[float] = field(default_factory=list)  # submit, from scheduled send
    send_late: list[float] = field(default_factory=list)  # generator lateness at send
    cancel_latencies: list[float] = field(default_factory=list)
    accepted: int = 0
    states: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    cancels: int = 0
    cancel_conflicts: int = 0
    list_latencies: list[float] = field(default_factory=list)
    pending: set[asyncio.Task[None]] = field(default_factory=set)


async def list_one(pool: Pool, load: Load, sched: float, user: str) -> None:
    try:
        status, _ = await pool.call("GET", "/api/requests?limit=50", token_of(user))
    except (OSError, asyncio.IncompleteReadError) as e:
        load.errors[f"list {type(e).__name__}"] += 1
        return
    load.list_latencies.append(time.perf_counter() - sched)
    if status != 200:
        load.errors[f"list HTTP {status}"] += 1


async def submit_one(
    pool: Pool, load: Load, sched: float, user: str, tenant: str, rng: random.Random
) -> None:
    late = time.perf_counter() - sched
    load.send_late.append(late)
    body = {
        "tenant": tenant,
        "kind": rng.choice(("kernel", "job")),
        "gpus": rng.choice((1, 1, 1, 2)),
        "name": "load",
    }
    try:
        status, payload = await pool.call(
            "POST", "/api/requests", token_of(user), json.dumps(body).encode()
        )
    except (OSError, asyncio.IncompleteReadError) as e:
        load.errors[f"submit {type(e).__name__}"] += 1
        return
    load.latencies.append(time.perf_counter() - sched)
    if status != 201:
        load.errors[f"submit HTTP {status}"] += 1
        return
    load.accepted += 1
    obj = json.loads(payload)
    load.states[obj["state"]] += 1
    await asyncio.sleep(rng.uniform(1.0, 9.0))
    t0 = time.perf_counter()
    try:
        status, payload = await pool.call("DELETE", f"/api/requests/{obj['id']}", token_of(user))
    except (OSError, asyncio.IncompleteReadError) as e:
        load.errors[f"cancel {type(e).__name__}"] += 1
        return
    load.cancel_latencies.append(time.perf_counter() - t0)
    load.cancels += 1
    if status == 409:  # ended on its own (preempted, lease expired): not an error
        load.cancel_conflicts += 1
    elif status != 200:
        load.errors[f"cancel HTTP {status}"] += 1


async def run_load(
    pool: Pool, rate: float, duration: float, seed: int, list_rate: float = 0.0
) -> Load:
    load = Load()
    rng = random.Random(seed)
    who = users()
    start = time.perf_counter() + 0.05
    # Submissions at i/rate and list reads at j/list_rate, merged in time order.
    events = [(i / rate, 0) for i in range(int(rate * duration))]
    if list_rate > 0:
        events += [(j / list_rate, 1) for j in range(int(list_rate * duration))]
    events.sort()
    for offset, what in events:
        sched = start + offset
        delay = sched - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        user, tenant = who[rng.randrange(len(who))]
        if what == 0:
            task = asyncio.create_task(submit_one(pool, load, sched, user, tenant, rng))
        else:
            task = asyncio.create_task(list_one(pool, load, sched, user))
        load.pending.add(task)
        task.add_done_callback(load.pending.discard)
    return load


# --------------------------------------------------------------------------- release probe


async def release_probes(pool: Pool, port: int, probes: int) -> dict[str, Any]:
    """DELETE the h100 holder; time until the queued waiter's admit reaches its listener."""
    admitted: dict[str, float] = {}
    waiters: dict[str, asyncio.Future[float]] = {}

    def on_event(name: str, data: dict[str, Any], now: float) -> None:
        if name == "admit":
            fut = waiters.pop(data.get("id", ""), None)
            if fut is not None and not fut.done():
                fut.set_result(time.perf_counter())
            admitted[data.get("id", "")] = now

    listener = SSE(PROBE, [], on_event)
    await open_listener(port, listener)
    tok = token_of(PROBE)
    body = json.dumps({"tenant": PROBE, "kind": "kernel", "gpus": 1, "flavor": "h100"}).encode()
    status, payload = await pool.call("POST", "/api/requests", tok, body)
    assert status == 201, payload
    holder = json.loads(payload)
    assert holder["state"] == "admitted", holder
    times: list[float] = []
    for _ in range(probes):
        status, payload = await pool.call("POST", "/api/requests", tok, body)
        assert status == 201, payload
        waiter = json.loads(payload)
        assert waiter["state"] == "queued", waiter
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        waiters[waiter["id"]] = fut
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        status, payload = await pool.call("DELETE", f"/api/requests/{holder['id']}", tok)
        assert status == 200, payload
        t1 = await asyncio.wait_for(fut, 10)
        times.append(t1 - t0)
        holder = waiter
    await pool.call("DELETE", f"/api/requests/{holder['id']}", tok)
    assert listener.transport is not None
    listener.transport.close()
    ms = [t * 1000 for t in times]
    return {
        "n": len(ms),
        "median_ms": round(pct(ms, 50), 1),
        "p95_ms": round(pct(ms, 95), 1),
        "max_ms": round(max(ms), 1),
    }


# --------------------------------------------------------------------------- listeners apart


@dataclass
class Heard:
    """What one stream of the listener process received (the fields of SSE it counts)."""

    who: str
    events: int
    resets: int
    closed: bool
    transport: None = None


class Crowd:
    """The SSE listeners' child process (_sse_crowd.py): one line each way on its pipes."""

    def __init__(self, child: asyncio.subprocess.Process) -> None:
        self.child = child
        self.pid = child.pid

    @classmethod
    async def start(cls, port: int, who: list[str], sample: int) -> Crowd:
        script = Path(__file__).with_name("_sse_crowd.py")
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            str(port),
            json.dumps(who),
            f"--sample={sample}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 28,  # the report is one line of a few MiB
        )
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        if line.strip() != b"ready":
            raise SystemExit(f"the listener process did not start: {line!r}")
        return cls(child)

    async def report(self, lags: list[float]) -> list[Heard]:
        """Every stream's counts, once the streams are quiet; their lags into `lags`."""
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(b"report\n")
        await self.child.stdin.drain()
        got = json.loads(await asyncio.wait_for(self.child.stdout.readline(), 120))
        lags.extend(got["lags"])
        return [Heard(w, n, r, c) for w, n, r, c in got["streams"]]

    async def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        try:
            await asyncio.wait_for(self.child.wait(), 20)
        except asyncio.TimeoutError:
            self.child.kill()


# --------------------------------------------------------------------------- main


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    proc, port, db = start_gateway(tmp, args.gateway_arg or [], args.nice, args.history)
    try:
        rss_idle = proc_status(proc.pid)
        pool = Pool(port)
        await pool.warm(args.connections)
        # Listeners: 10% by the viewers (they hear everything), the rest over the users.
        lags: list[float] = []
        listeners: list[SSE] = []
        who = [u for u, _ in users()]
        viewers, nv = round(args.listeners * args.viewer_share), 0
        for i in range(args.listeners):
            # Viewers spread evenly among the listeners (every 10th at the default 0.1).
            if (i + 1) * viewers // args.listeners > i * viewers // args.listeners:
                user = VIEWERS[nv % len(VIEWERS)]
                nv += 1
            else:
                user = who[i % len(who)]
            listeners.append(SSE(user, lags))
        crowd = None
        if args.listener_process:
            crowd = await Crowd.start(port, [s.who for s in listeners], args.sample)
        else:
            for i in range(0, len(listeners), 50):
                await asyncio.gather(*(open_listener(port, s) for s in listeners[i : i + 50]))
        rss_listening = proc_status(proc.pid)
        seq0 = last_seq(db)
        cpu0, wall0 = cpu_seconds(proc.pid), time.perf_counter()
        own0 = time.process_time()
        crowd0 = cpu_seconds(crowd.pid) if crowd else 0.0
        sys0, at0 = system_cpu()
        load0 = os.getloadavg()[0]
        print(
            f"gateway pid {proc.pid} on :{port}; {len(listeners)} listeners connected; "
            f"{args.rate:g}/s for {args.duration:g} s ...",
            file=sys.stderr,
        )
        load = await run_load(pool, args.rate, args.duration, args.seed, args.list_rate)
        submitted_wall = time.perf_counter() - wall0
        window_cpu = cpu_seconds(proc.pid) - cpu0
        own_cpu = time.process_time() - own0
        crowd_cpu = cpu_seconds(crowd.pid) - crowd0 if crowd else 0.0
        sys1, at1 = system_cpu()
        used = [(b - a) / (at1 - at0) for a, b in zip(sys0, sys1, strict=True)]
        machine_busy = sum(used) - used[3] - used[4]
        # Let the cancels scheduled by the last submissions happen, then settle.
        if load.pending:
            await asyncio.wait(list(load.pending), timeout=60)
        gateway_cpu = cpu_seconds(proc.pid) - cpu0
        if crowd is not None:
            listeners = await crowd.report(lags)  # type: ignore[assignment]
        else:
            await quiet(listeners)
        seq1 = last_seq(db)
        per_user, total = expected_deliveries(db, seq0, seq1)
        expected = 0
        received = 0
        short: list[str] = []
        for sse in listeners:
            want = total if sse.who in VIEWERS else per_user[sse.who] + per_user[""]
            expected += want
            received += sse.events
            if sse.events != want or sse.closed:
                short.append(f"{sse.who}: {sse.events}/{want}{' closed' if sse.closed else ''}")
        streams = scrape_streams(port)
        probe = await release_probes(pool, port, args.probes)
        status = proc_status(proc.pid)
        pool.close()
        for sse in listeners:
            if sse.transport is not None:
                sse.transport.close()
        if crowd is not None:
            await crowd.close()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    inside = server_times(tmp / "gateway.log")
    lat = [x * 1000 for x in load.latencies]
    late = [x * 1000 for x in load.send_late]
    canc = [x * 1000 for x in load.cancel_latencies]
    lag = [x * 1000 for x in lags]
    n_err = sum(load.errors.values())
    result = {
        "machine": machine(),
        "command": " ".join(["benchmarks/gateway_load.py", *sys.argv[1:]]),
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "listeners": args.listeners,
        "viewer_share": args.viewer_share,
        "submitted": len(load.latencies)
        + sum(n for k, n in load.errors.items() if k.startswith("submit ") and "HTTP" not in k),
        "submit_window_s": round(submitted_wall, 2),
        "accepted": load.accepted,
        "states_at_submit": dict(load.states),
        "errors": n_err,
        "error_kinds": dict(load.errors),
        "submit_ms": {
            "p50": round(pct(lat, 50), 1),
            "p95": round(pct(lat, 95), 1),
            "p99": round(pct(lat, 99), 1),
            "max": round(max(lat, default=math.nan), 1),
        },
        # the same, inside the gateway (tornado's request_time, from its access log)
        "submit_in_gateway_ms": {
            "p50": round(pct(inside["POST"], 50), 1),
            "p99": round(pct(inside["POST"], 99), 1),
            "max": round(max(inside["POST"], default=math.nan), 1),
        },
        "history_rows": args.history,
        "list_ms": {
            "n": len(load.list_latencies),
            "p50": round(pct([x * 1000 for x in load.list_latencies], 50), 1),
            "p99": round(pct([x * 1000 for x in load.list_latencies], 99), 1),
        },
        "generator_late_ms": {"p99": round(pct(late, 99), 1), "max": round(max(late), 1)},
        "cancels": load.cancels,
        "cancel_conflicts": load.cancel_conflicts,
        "cancel_ms": {"p50": round(pct(canc, 50), 1), "p99": round(pct(canc, 99), 1)},
        "connections_opened": pool.opened,
        "gateway_cpu_s": round(gateway_cpu, 1),
        # CPU seconds per second of the submission window: gateway and this generator
        "cpu_share_in_window": {
            "gateway": round(window_cpu / submitted_wall, 2),
            "generator": round(own_cpu / submitted_wall, 2),
            # the SSE listeners' process (--listener-process; else in the generator's)
            "listeners": round(crowd_cpu / submitted_wall, 2),
            # everything else on the machine (other jobs, the kernel's own threads)
            "others": round(machine_busy - (window_cpu + own_cpu + crowd_cpu) / submitted_wall, 2),
            "of_which_softirq": round(used[6], 2),  # loopback TCP is mostly softirq
            "steal": round(used[7], 2),
            "idle": round(used[3] + used[4], 2),
        },
        "load_average_at_start": round(load0, 2),
        "nice": args.nice,
        "gateway_cpu_ms_per_submission": round(1000 * gateway_cpu / max(1, load.accepted), 2),
        "rss_mib": {
            "idle": round(rss_idle["VmRSS"] / 1024, 1),
            "listening": round(rss_listening["VmRSS"] / 1024, 1),
            "end": round(status["VmRSS"] / 1024, 1),
            "peak": round(status["VmHWM"] / 1024, 1),
        },
        "sse": {
            "decisions": total,
            "expected_deliveries": expected,
            "received": received,
            "missing": expected - received,
            "listeners_short": short[:10],
            "resets_received": sum(sse.resets for sse in listeners),
            # the gateway's own counts (metrics): open streams, streams dropped
            "streams": streams,
            "lag_ms": {
                "p50": round(pct(lag, 50), 1),
                "p99": round(pct(lag, 99), 1),
                "max": round(max(lag, default=math.nan), 1),
            },
        },
        "release_to_admit": probe,
    }
    result["pass"] = {
        "submit_p99_under_50ms": result["submit_ms"]["p99"] < TARGETS["submit_p99_ms"],
        "zero_errors": n_err == 0 and not short,
        "rss_under_300mib": result["rss_mib"]["peak"] < TARGETS["rss_mib"],
        "release_to_admit_under_100ms": probe["max_ms"] < TARGETS["release_to_admit_ms"],
    }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5 s, 50/s, 50 listeners, 5 probes")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--listeners", type=int, default=500)
    p.add_argument(
        "--viewer-share",
        type=float,
        default=0.1,
        help="share of the listeners opened by users with view rights, who hear every "
        "decision (1: all of them, the fan-out case of issue 40)",
    )
    p.add_argument("--probes", type=int, default=20)
    p.add_argument(
        "--listener-process",
        action="store_true",
        help="run the SSE listeners in a child process of their own (_sse_crowd.py), so "
        "reading their events does not make the submissions late",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=20,
        help="with --listener-process: every K-th listener times its events' lag",
    )
    p.add_argument("--connections", type=int, default=32, help="keep-alive connections")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    p.add_argument("--history", type=int, default=0, help="ended requests put in the store first")
    p.add_argument(
        "--list-rate", type=float, default=0.0, help="GET api/requests per second, by users"
    )
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="scheduling niceness of the gateway and the generator (negative needs root): "
        "keeps unrelated jobs on a shared machine from taking the CPU from them",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (db, gateway log)")
    p.add_argument(
        "--gateway-arg", action="append", help="extra gateway flag (repeatable)", default=[]
    )
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.rate, args.listeners, args.probes = 5.0, 50.0, 50, 5
    tmp = Path(tempfile.mkdtemp(prefix="gw-load-"))
    restore_autogroup = prioritize(args.nice)
    try:
        result = asyncio.run(bench(args, tmp))
    finally:
        restore_autogroup()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if all(result["pass"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
