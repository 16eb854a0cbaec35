"""Kueue's scheduler performance baseline, replayed by `jupyter-gpuaas simulate`.

The shape is Kueue's `test/performance/scheduler/configs/baseline/generator.yaml`:
5 cohorts x 6 tenants (ClusterQueues), nominal quota 20, borrowing limit 100,
reclaimWithinCohort Any, withinClusterQueue LowerPriority, and per tenant

    350 small:   1 GPU, runs 0.2 s, priority  50, one every 0.1 s
    100 medium:  5 GPUs, runs 0.5 s, priority 100, one every 0.5 s
     50 large:  20 GPUs, runs 1.0 s, priority 200, one every 1.2 s

15,000 requests in all. Kueue's own run of it takes about 351 s of wall time
(`rangespec.yaml`: average 351116 ms); the target here is the whole
`jupyter-gpuaas simulate` process under 3 s (best of 3, median reported too).

Nodes: one flavor, 30 nodes x 20 GPUs = 600 GPUs = 5 x 6 x 20, the total nominal quota.
Kueue's perf test admits by quota alone (no nodes); capacity equal to the quota keeps quota
the binding constraint, and 20-GPU nodes are the narrowest on which a large (20-GPU)
request fits, so every request can be placed and placement (best fit over 30 nodes) is
still exercised. Requests are `job`s: a preempted Kueue workload is requeued, and so is a
preempted job here.

    .venv/bin/python benchmarks/kueue_baseline.py [--out DIR] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import _bench

# (class, count per tenant, gpus, runtime s, priority, creation interval s)
CLASSES: tuple[tuple[str, int, int, float, int, float], ...] = (
    ("small", 350, 1, 0.2, 50, 0.1),
    ("medium", 100, 5, 0.5, 100, 0.5),
    ("large", 50, 20, 1.0, 200, 1.2),
)
COHORTS = 5
TENANTS_PER_COHORT = 6
NOMINAL = 20
BORROWING_LIMIT = 100
KUEUE_WALL_S = 351.1  # rangespec.yaml: average of 5 trial runs
# rangespec.yaml: Kueue's measured averages (time to admission, ms; cq min usage %).
KUEUE_AVG_ADMISSION_S = {"small": 215.468, "medium": 76.768, "large": 6.666}
KUEUE_MIN_USAGE_PCT = 58.7
TARGET_S = 3.0


def build(
    cohorts: int = COHORTS,
    tenants_per_cohort: int = TENANTS_PER_COHORT,
    scale: float = 1.0,
    nodes: int | None = None,
    gpus_per_node: int = 20,
    classes: tuple[tuple[str, int, int, float, int, float], ...] = CLASSES,
) -> dict[str, Any]:
    """The scenario document. `scale` shrinks the per-tenant counts (for smoke tests);
    `classes` are the per-tenant request classes (kueue_large.py passes its own)."""
    tenants: dict[str, Any] = {}
    requests: list[dict[str, Any]] = []
    for c in range(cohorts):
        for t in range(tenants_per_cohort):
            name = f"c{c}t{t}"
            tenants[name] = {
                "cohort": f"cohort{c}",
                "quota": {"gpu": NOMINAL},
                "borrowing_limit": {"gpu": BORROWING_LIMIT},
                "preemption": {
                    "within_tenant": "LowerPriority",
                    "reclaim_within_cohort": "Any",
                },
            }
            for cls, count, gpus, runtime, priority, every in classes:
                for i in range(max(1, round(count * scale))):
                    requests.append(
                        {
                            "id": f"{name}-{cls}-{i}",
                            "tenant": name,
                            "user": f"{name}-user",
                            "kind": "job",
                            "gpus": gpus,
                            "priority": priority,
                            "submit": round(i * every, 6),
                            "duration": runtime,
                        }
                    )
    total_nominal = cohorts * tenants_per_cohort * NOMINAL
    if nodes is None:
        nodes = -(-total_nominal // gpus_per_node)
    return {
        "flavors": {"gpu": {"nodes": nodes, "gpus_per_node": gpus_per_node}},
        "tenants": tenants,
        "requests": requests,
    }


def generate(out: Path, **kwargs: Any) -> Path:
    """Write the scenario as JSON (the CLI reads JSON or YAML) and return its path."""
    path = out / "kueue-baseline.json"
    path.write_text(json.dumps(build(**kwargs)), encoding="utf-8")
    return path


def class_of(rid: str) -> str:
    return rid.split("-")[1]


def by_class(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Wait percentiles, admissions and preemptions per request class."""
    groups: dict[str, list[dict[str, Any]]] = {cls: [] for cls, *_ in CLASSES}
    for rid, r in result["requests"].items():
        groups[class_of(rid)].append(r)
    out: dict[str, dict[str, Any]] = {}
    for cls, rows in groups.items():
        waits = [r["wait"] for r in rows if r["state"] != "rejected"]
        out[cls] = {
            "requests": len(rows),
            "admitted": sum(1 for r in rows if r["admitted_at"] is not None),
            "finished": sum(1 for r in rows if r["state"] == "finished"),
            "wait_mean": round(sum(waits) / len(waits), 3) if waits else 0.0,
            "wait_p50": _bench.percentile(waits, 50),
            "wait_p95": _bench.percentile(waits, 95),
            "wait_max": max(waits, default=0.0),
            "preemptions": sum(r["preemptions"] for r in rows),
            "preempted_requests": sum(1 for r in rows if r["preemptions"]),
        }
    return out


def measure(out: Path, repeat: int = 3) -> dict[str, Any]:
    scenario = generate(out)
    timing, result = _bench.time_simulate(scenario, repeat)
    s = result["summary"]
    return {
        "benchmark": "kueue_baseline",
        "scenario": _bench.rel(scenario),
        "requests": s["requests"],
        "timing": timing.as_dict(),
        "target_s": TARGET_S,
        "pass": timing.best < TARGET_S,
        "kueue_wall_s": KUEUE_WALL_S,
        "speedup_vs_kueue": round(KUEUE_WALL_S / timing.best, 1),
        "simulated_s": s["end"],
        "decisions": result["decisions"],
        "sim_wall_s": result["wall_seconds"],
        "utilization": s["utilization"],
        "gpu_hours_allocated": s["gpu_hours_allocated"],
        "gpu_hours_capacity": s["gpu_hours_capacity"],
        "admitted": s["admitted"],
        "rejected": s["rejected"],
        "never_admitted": s["never_admitted"],
        "preemptions": s["preemptions"],
        "classes": by_class(result),
        "kueue_avg_admission_s": KUEUE_AVG_ADMISSION_S,
        "kueue_min_usage_pct": KUEUE_MIN_USAGE_PCT,
    }


def text(r: dict[str, Any]) -> str:
    t = r["timing"]
    lines = [
        f"Kueue scheduler baseline: {r['requests']} requests, 30 tenants in 5 cohorts,"
        " 30 nodes x 20 GPUs",
        f"  command     {t['command']}",
        f"  wall        best {t['best_s']:.3f} s, median {t['median_s']:.3f} s"
        f" (runs {t['walls']}, CPU {t['cpu_s']}), peak RSS {t['max_rss_mib']:.0f} MiB",
        f"  target      < {r['target_s']:.0f} s: {'PASS' if r['pass'] else 'FAIL'}"
        f" (Kueue: {r['kueue_wall_s']:.0f} s, {r['speedup_vs_kueue']}x)",
        f"  simulated   {r['simulated_s']:.1f} s of clock, {r['decisions']} decisions,"
        f" core+driver {r['sim_wall_s']:.3f} s",
        f"  utilization {r['utilization'] * 100:.1f}%  admitted {r['admitted']},"
        f" never admitted {r['never_admitted']}, preemptions {r['preemptions']}",
        "  class    requests admitted  wait p50  wait p95  wait max  mean   preemptions",
    ]
    for cls, c in r["classes"].items():
        lines.append(
            f"  {cls:<8} {c['requests']:>8} {c['admitted']:>8} {c['wait_p50']:>8.2f}s"
            f" {c['wait_p95']:>8.2f}s {c['wait_max']:>8.2f}s {c['wait_mean']:>6.2f}s"
            f" {c['preemptions']:>6} ({c['preempted_requests']} requests)"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the generated scenario (benchmarks/generated)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (default 3)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    r = measure(_bench.out_dir(args.out), args.repeat)
    _bench.emit(r, args.json, text(r))
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
