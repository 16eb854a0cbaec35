"""A month of notebook traffic: 100,000 requests on about 1,000 GPUs, replayed whole.

The generator is random but seeded (same seed, same bytes). It writes a scenario whose
requests come from a CSV `requests_file` (the path a real exported trace takes):

* 3 flavors, 1,000 GPUs: a100 64x8, h100 32x8, l4 58x4 (l4 may autoscale to 70 nodes).
* 13 tenants: 3 cohorts (research, product, teaching) with borrowing and lending limits,
  varied preemption policies and weights, one StrictFIFO tenant, two without cohort.
* kernels (bursty: busy intervals separated by idle gaps, some long enough to be culled),
  servers (long, mostly idle), jobs (busy throughout, lower priority, preemptible);
  some pinned flavors, some cancellations.
* arrivals follow working hours (weekday 9:00-18:00 peaks, quiet nights and weekends) and
  teaching tenants add class sessions: a whole class starting kernels within minutes.
* policy: fair sharing, idle_timeout 30 min, reservation_ttl 20 min.

Targets (issue 15): the whole `jupyter-gpuaas simulate` process under 10 s with the core
compiled, under 20 s as pure Python (`GPUAAS_PURE=1`, or no C compiler), and under 500 MiB
peak RSS. (Issue 2 asked for 30 s and 1 GiB.)

    .venv/bin/python benchmarks/month_trace.py [--out DIR] [--requests 100000] [--seed 7]
        [--repeat 3] [--pure] [--json]

`--pure` runs the simulator on a copy of the package without its compiled modules, as
pure Python (the core's other target), whatever `make core` built.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench

DAY = 86400.0
DAYS = 30
# By how the core runs (`_bench.core_build()`): compiled with mypyc, or the source itself.
TARGET_S = {"compiled with mypyc": 10.0, "pure Python": 20.0}
TARGET_RSS_MIB = 500.0
TIMEOUT_S = 900.0  # a run is killed past this: it has missed either target 45 times over

FLAVORS = {
    "a100": {"nodes": 64, "gpus_per_node": 8},
    "h100": {"nodes": 32, "gpus_per_node": 8},
    "l4": {"nodes": 58, "gpus_per_node": 4},
}

# By default kernels and servers share a priority above jobs, and nobody reclaims with
# `Any`, so only jobs are preempted: the trace the recorded results use. With
# `--preempt-interactive`, servers rank below kernels, research reclaims with Any and
# teaching uses LowerOrNewerEqualPriority, so kernels and servers are preempted too (once
# a driver crash when one was admitted and preempted within one cycle; fixed).
SERVER_PRIORITY = 100
_RESEARCH = {"within_tenant": "LowerPriority", "reclaim_within_cohort": "LowerPriority"}
_PRODUCT = {
    "within_tenant": "LowerPriority",
    "reclaim_within_cohort": "LowerPriority",
    "borrow_within_cohort": "LowerPriority",
}
_TEACHING = {"within_tenant": "LowerPriority"}
_INTERACTIVE = {
    "research": {"within_tenant": "LowerPriority", "reclaim_within_cohort": "Any"},
    "teaching": {"within_tenant": "LowerOrNewerEqualPriority"},
}

# name: (cohort, quota, extra settings, users, share of the traffic)
TENANTS: dict[str, tuple[str | None, dict[str, int], dict[str, Any], int, float]] = {
    "vision": ("research", {"a100": 96, "h100": 64}, {"preemption": _RESEARCH}, 40, 0.12),
    "nlp": (
        "research",
        {"h100": 96, "a100": 128},
        {"preemption": _RESEARCH, "weight": 2, "borrowing_limit": {"h100": 64}},
        60,
        0.16,
    ),
    "rl": ("research", {"a100": 64, "h100": 32}, {"preemption": _RESEARCH}, 25, 0.07),
    "speech": (
        "research",
        {"a100": 48, "h100": 32},
        {"preemption": _RESEARCH, "lending_limit": {"a100": 16}},
        20,
        0.06,
    ),
    "search": ("product", {"a100": 64, "l4": 32}, {"preemption": _PRODUCT}, 30, 0.09),
    "recsys": ("product", {"l4": 40, "a100": 48}, {"preemption": _PRODUCT}, 30, 0.09),
    "ads": (
        "product",
        {"a100": 32, "l4": 24},
        {"preemption": _PRODUCT, "borrowing_limit": {"a100": 32, "l4": 16}},
        20,
        0.06,
    ),
    "course-ml": ("teaching", {"l4": 56}, {"preemption": _TEACHING}, 120, 0.05),
    "course-dl": ("teaching", {"l4": 40}, {"preemption": _TEACHING}, 90, 0.04),
    "workshops": ("teaching", {"l4": 24}, {"idle_timeout": 900}, 60, 0.03),
    "platform": (None, {"a100": 32, "h100": 32}, {"queueing": "StrictFIFO"}, 8, 0.05),
    "interns": (None, {"l4": 16}, {"reservation_ttl": 0}, 30, 0.04),
    "guests": (None, {"a100": 0, "h100": 0}, {}, 5, 0.02),  # no quota: every request rejected
}
TEACHING = ("course-ml", "course-dl", "workshops")

# Hourly arrival weights on a weekday (index = hour); weekends run at 15% of this.
_WEEKDAY = (
    *(0.15, 0.1, 0.08, 0.08, 0.08, 0.1, 0.2, 0.5, 1.2),  # 0:00-8:59
    *(2.6, 3.2, 3.0, 1.8, 2.4, 3.0, 3.0, 2.6, 2.0, 1.2),  # 9:00-18:59
    *(0.8, 0.7, 0.6, 0.4, 0.25),  # 19:00-23:59
)
_WEEKEND = 0.15


def _hour_weights() -> list[float]:
    out = []
    for day in range(DAYS):
        weekend = day % 7 in (5, 6)
        out += [w * (_WEEKEND if weekend else 1.0) for w in _WEEKDAY]
    return out


def _busy_intervals(rng: random.Random, duration: float, kind: str) -> list[list[int]]:
    """Bursts of work separated by idle gaps: thinking, meetings, lunch, forgotten tabs."""
    out: list[list[int]] = []
    t = 0.0 if kind == "kernel" else rng.uniform(0, 600)
    burst_mean = 600.0 if kind == "kernel" else 900.0
    while t < duration:
        burst = rng.expovariate(1 / burst_mean) + 30
        end = min(duration, t + burst)
        if end - t >= 1:
            out.append([round(t), round(end)])
        # Mostly short pauses; now and then a long one (past the 30 min idle timeout).
        r = rng.random()
        if r < 0.65:
            gap = rng.expovariate(1 / 420)
        elif r < 0.9:
            gap = rng.uniform(900, 2400)
        else:
            gap = rng.uniform(2400, 7200)
        t = end + max(60.0, gap)
    # Rounding may make neighbours touch or invert: keep them sorted and disjoint.
    clean: list[list[int]] = []
    for s, e in out:
        if clean and s <= clean[-1][1]:
            s = clean[-1][1] + 1
        if e > s:
            clean.append([s, e])
    return clean


def _lognormal(rng: random.Random, median: float, sigma: float, lo: float, hi: float) -> int:
    return round(min(hi, max(lo, rng.lognormvariate(math.log(median), sigma))))


def _request(
    rng: random.Random,
    i: int,
    tenant: str,
    submit: float,
    kind: str | None,
    server_priority: int,
) -> dict[str, Any]:
    cohort, quota, _, users, _ = TENANTS[tenant]
    if kind is None:
        r = rng.random()
        kind = "kernel" if r < 0.55 else "server" if r < 0.78 else "job"
    flavor = ""
    if kind == "class":  # a student's kernel in a class session: one GPU for the lesson
        kind = "kernel"
        gpus = 1
        duration = _lognormal(rng, 3600, 0.3, 1200, 7200)
        priority = 100
    elif kind == "kernel":
        gpus = rng.choices((1, 2, 4, 8), (70, 20, 8, 2))[0]
        duration = _lognormal(rng, 7200, 0.8, 300, 12 * 3600)
        priority = 100
    elif kind == "server":
        gpus = rng.choices((1, 2, 4), (75, 20, 5))[0]
        duration = _lognormal(rng, 6 * 3600, 0.5, 1800, 14 * 3600)
        priority = server_priority
    else:
        gpus = rng.choices((1, 2, 4, 8), (35, 30, 20, 15))[0]
        duration = _lognormal(rng, 3600, 1.0, 120, 24 * 3600)
        priority = rng.choice((0, 0, 0, 10))
    if tenant in TEACHING or list(quota) == ["l4"]:
        gpus = min(gpus, 2)
    usable = [f for f, n in quota.items() if n > 0 or cohort is not None]
    if usable and rng.random() < 0.25:
        flavor = rng.choice(usable)
        if flavor == "l4":
            gpus = min(gpus, 4)
    busy = "" if kind == "job" else json.dumps(_busy_intervals(rng, duration, kind))
    cancel = ""
    if rng.random() < 0.04:  # gave up waiting, or closed the tab early
        cancel = f"{submit + rng.uniform(60, 3600):.0f}"
    return {
        "id": f"r{i:06d}",
        "tenant": tenant,
        "user": f"{tenant}-u{rng.randrange(users)}",
        "kind": kind,
        "gpus": gpus,
        "flavor": flavor,
        "priority": priority,
        "submit": f"{submit:.0f}",
        "duration": duration,
        "busy": busy.replace(" ", ""),
        "cancel": cancel,
    }


def build_requests(n: int, seed: int, preempt_interactive: bool = False) -> list[dict[str, Any]]:
    """`n` requests over 30 days, sorted by submit time, ids in that order."""
    server_priority = 50 if preempt_interactive else SERVER_PRIORITY
    rng = random.Random(seed)
    names = list(TENANTS)
    shares = [TENANTS[t][4] for t in names]
    hours = _hour_weights()
    # ~6% of the traffic comes as class sessions of the teaching tenants.
    in_classes = n * 6 // 100
    arrivals: list[tuple[float, str, str | None]] = []
    while len(arrivals) < in_classes:
        day = rng.randrange(DAYS)
        if day % 7 in (5, 6):
            continue
        start = day * DAY + rng.choice((9, 10, 11, 14, 15, 16)) * 3600.0
        tenant = rng.choice(TEACHING)
        size = min(in_classes - len(arrivals), rng.randint(15, 60))
        for _ in range(size):
            arrivals.append((start + rng.expovariate(1 / 120), tenant, "class"))
    hour_picks = rng.choices(range(len(hours)), weights=hours, k=n - in_classes)
    tenant_picks = rng.choices(names, weights=shares, k=n - in_classes)
    for h, tenant in zip(hour_picks, tenant_picks, strict=True):
        arrivals.append((h * 3600.0 + rng.uniform(0, 3600), tenant, None))
    arrivals.sort(key=lambda a: a[0])
    return [_request(rng, i, t, s, k, server_priority) for i, (s, t, k) in enumerate(arrivals)]


def build_config(preempt_interactive: bool = False) -> dict[str, Any]:
    tenants: dict[str, Any] = {}
    for name, (cohort, quota, extra, _, _) in TENANTS.items():
        spec: dict[str, Any] = {"quota": dict(quota), **extra}
        if preempt_interactive and cohort in _INTERACTIVE and "preemption" in spec:
            spec["preemption"] = _INTERACTIVE[cohort]
        if cohort is not None:
            spec = {"cohort": cohort, **spec}
        tenants[name] = spec
    return {
        "flavors": FLAVORS,
        "tenants": tenants,
        "policy": {
            "fair_sharing": True,
            "idle_timeout": 1800,
            "reservation_ttl": 1200,
            "autoscale": {"l4": {"max_nodes": 70, "provision_delay": 300, "scale_down_after": 900}},
        },
        "until": DAYS * DAY,
    }


def capacity_gpus() -> int:
    return sum(f["nodes"] * f["gpus_per_node"] for f in FLAVORS.values())


def generate(
    out: Path, requests: int = 100_000, seed: int = 7, preempt_interactive: bool = False
) -> Path:
    """Write `month.json` and its `month.csv` trace into `out`; return the scenario path."""
    rows = build_requests(requests, seed, preempt_interactive)
    trace = out / "month.csv"
    with trace.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    doc = {**build_config(preempt_interactive), "requests_file": trace.name}
    path = out / "month.json"
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return path


def measure(
    out: Path,
    requests: int = 100_000,
    seed: int = 7,
    repeat: int = 3,
    preempt_interactive: bool = False,
    timeout: float = TIMEOUT_S,
    pure: bool = False,
) -> dict[str, Any]:
    started = time.perf_counter()
    scenario = generate(out, requests, seed, preempt_interactive)
    generate_s = time.perf_counter() - started
    core = "pure Python" if pure else _bench.core_build()
    target_s = TARGET_S[core]
    with tempfile.TemporaryDirectory() as tmp:
        env = _bench.pure_env(_bench.pure_copy(Path(tmp))) if pure else None
        # A run over twice the target is not repeated; one past `timeout` is killed.
        timing, result = _bench.time_simulate(scenario, repeat, 2 * target_s, timeout, env)
    completed = bool(result)
    s = result.get("summary") or {"requests": requests}
    kinds: dict[str, int] = {}
    states: dict[str, int] = {}
    for r in result.get("requests", {}).values():
        states[r["state"]] = states.get(r["state"], 0) + 1
    with (out / "month.csv").open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    ok_time = completed and timing.best < target_s
    ok_rss = completed and timing.max_rss_mib < TARGET_RSS_MIB
    return {
        "benchmark": "month_trace",
        "scenario": _bench.rel(scenario),
        "trace": _bench.rel(out / "month.csv"),
        "seed": seed,
        "preempt_interactive": preempt_interactive,
        "generate_s": round(generate_s, 2),
        "requests": s["requests"],
        "kinds": kinds,
        "capacity_gpus": capacity_gpus(),
        "timing": timing.as_dict(),
        "core": core,
        "target_s": target_s,
        "target_rss_mib": TARGET_RSS_MIB,
        "pass_time": ok_time,
        "pass_rss": ok_rss,
        "pass": ok_time and ok_rss,
        "completed": completed,
        "timeout_s": timeout,
        "decisions": result.get("decisions", 0),
        "sim_wall_s": result.get("wall_seconds", 0.0),
        "states": states,
        "summary": {k: v for k, v in s.items() if k != "per_tenant"},
    }


def _dur(seconds: float) -> str:
    s = round(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def text(r: dict[str, Any]) -> str:
    t = r["timing"]
    s = r["summary"]
    if not r["completed"]:
        return (
            f"Month of notebook traffic: {r['requests']} requests, {r['capacity_gpus']} GPUs\n"
            f"  command     {t['command']}\n"
            f"  TIMED OUT   killed after {t['best_s']:.0f} s (target < {r['target_s']:.0f} s):"
            " FAIL\n"
        )
    return (
        f"Month of notebook traffic: {r['requests']} requests ({r['kinds']}),"
        f" {r['capacity_gpus']} GPUs, seed {r['seed']}; core {r['core']}\n"
        f"  command     {t['command']}\n"
        f"  wall        best {t['best_s']:.2f} s, median {t['median_s']:.2f} s (runs {t['walls']},"
        f" CPU {t['cpu_s']})"
        f" — target < {r['target_s']:.0f} s: {'PASS' if r['pass_time'] else 'FAIL'}\n"
        f"  peak RSS    {t['max_rss_mib']:.0f} MiB"
        f" — target < {r['target_rss_mib']:.0f} MiB: {'PASS' if r['pass_rss'] else 'FAIL'}\n"
        f"  simulated   {r['decisions']} decisions, core+driver {r['sim_wall_s']:.2f} s\n"
        f"  outcome     admitted {s['admitted']}, rejected {s['rejected']}, never admitted"
        f" {s['never_admitted']}, preemptions {s['preemptions']}, culls {s['culls']}\n"
        f"  waits       p50 {_dur(s['wait_p50'])}, p95 {_dur(s['wait_p95'])},"
        f" max {_dur(s['wait_max'])}\n"
        f"  GPU-hours   capacity {s['gpu_hours_capacity']:.0f}, allocated"
        f" {s['gpu_hours_allocated']:.0f}, busy {s['gpu_hours_busy']:.0f};"
        f" utilization {s['utilization'] * 100:.1f}%\n"
        f"  states      {r['states']}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the generated files (benchmarks/generated)")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (default 3)")
    parser.add_argument(
        "--preempt-interactive",
        action="store_true",
        help="let kernels and servers be preempted too (servers below kernels, reclaim Any)",
    )
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help="kill a run after this many seconds"
    )
    parser.add_argument(
        "--pure", action="store_true", help="run the core as pure Python (a copy without .so)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    r = measure(
        _bench.out_dir(args.out),
        args.requests,
        args.seed,
        args.repeat,
        args.preempt_interactive,
        args.timeout,
        args.pure,
    )
    _bench.emit(r, args.json, text(r))
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
