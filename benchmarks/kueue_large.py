"""Kueue's large-scale scheduler shape, beside its baseline: does the cost stay flat in tenants?

The shape is Kueue's `test/performance/scheduler/configs/large-scale/generator.yaml`
(kubernetes-sigs/kueue, as of commit 3aef7a891cbd; "20 cohorts x 100 queues = 2000 cluster
queues, 30 workloads per queue, 60,000 total"): 20 cohorts x 100 tenants (ClusterQueues),
nominal quota 20, borrowing limit 100, reclaimWithinCohort Any, withinClusterQueue
LowerPriority, and per tenant

    20 small:   1 GPU, runs 0.05 s, priority  50, one every 0.02 s
     7 medium:  5 GPUs, runs 0.1 s, priority 100, one every 0.05 s
     3 large:  20 GPUs, runs 0.2 s, priority 200, one every 0.2 s

Nodes follow kueue_baseline.py's rule (capacity = the total nominal quota, in nodes of 20
GPUs, the narrowest a large request fits on): 2,000 nodes x 20 = 40,000 GPUs. So the node
count grows with the tenants too; `--profile` tells which of the two a cost follows.

Both scenarios are timed as whole `jupyter-gpuaas simulate --json` processes (via _bench),
interleaved run by run so that load on the shared machine hits both alike. The result is
the cost per request (wall / requests, best of `--repeat`) of each, and their ratio
(target <= 1.5: flat in tenants). CPU time per request is given too.

`--profile` runs each once more under cProfile as pure Python (a copy of the package
without its compiled modules, put first on PYTHONPATH: nothing in the tree is touched)
and prints, per function, its own time per request on both shapes, sorted by the growth.

    .venv/bin/python benchmarks/kueue_large.py [--out DIR] [--repeat 3] [--json] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _bench
import kueue_baseline

# (class, count per tenant, gpus, runtime s, priority, creation interval s)
CLASSES: tuple[tuple[str, int, int, float, int, float], ...] = (
    ("small", 20, 1, 0.05, 50, 0.02),
    ("medium", 7, 5, 0.1, 100, 0.05),
    ("large", 3, 20, 0.2, 200, 0.2),
)
COHORTS = 20
TENANTS_PER_COHORT = 100
TARGET_RATIO = 1.5


def build(scale: float = 1.0, **kwargs: Any) -> dict[str, Any]:
    return kueue_baseline.build(
        cohorts=kwargs.pop("cohorts", COHORTS),
        tenants_per_cohort=kwargs.pop("tenants_per_cohort", TENANTS_PER_COHORT),
        scale=scale,
        classes=CLASSES,
        **kwargs,
    )


def generate(out: Path, **kwargs: Any) -> Path:
    path = out / "kueue-large.json"
    path.write_text(json.dumps(build(**kwargs)), encoding="utf-8")
    return path


def measure(out: Path, repeat: int = 3, scale: float = 1.0) -> dict[str, Any]:
    shapes = {"baseline": kueue_baseline.generate(out), "large": generate(out, scale=scale)}
    tenants = {
        "baseline": kueue_baseline.COHORTS * kueue_baseline.TENANTS_PER_COHORT,
        "large": COHORTS * TENANTS_PER_COHORT,
    }
    command = {k: [_bench.cli_path(), "simulate", str(p), "--json"] for k, p in shapes.items()}
    timing = {k: _bench.Timing(c) for k, c in command.items()}
    results: dict[str, dict[str, Any]] = {}
    for _ in range(repeat):
        for k, c in command.items():
            run = _bench.run_measured(c)
            timing[k].runs.append(run)
            results.setdefault(k, json.loads(run.stdout))
    rows: dict[str, Any] = {}
    for k, t in timing.items():
        s = results[k]["summary"]
        n = s["requests"]
        rows[k] = {
            "scenario": _bench.rel(shapes[k]),
            "requests": n,
            "tenants": tenants[k],
            "timing": t.as_dict(),
            "us_per_request": round(1e6 * t.best / n, 1),
            "us_per_request_median": round(1e6 * t.median / n, 1),
            "cpu_us_per_request": round(1e6 * t.best_cpu / n, 1),
            "sim_wall_s": results[k]["wall_seconds"],
            "core_us_per_request": round(1e6 * results[k]["wall_seconds"] / n, 1),
            "decisions": results[k]["decisions"],
            "admitted": s["admitted"],
            "never_admitted": s["never_admitted"],
            "preemptions": s["preemptions"],
            "utilization": s["utilization"],
        }
    ratio = rows["large"]["us_per_request"] / rows["baseline"]["us_per_request"]
    cpu_ratio = rows["large"]["cpu_us_per_request"] / rows["baseline"]["cpu_us_per_request"]
    return {
        "benchmark": "kueue_large",
        "machine": _bench.machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "baseline": rows["baseline"],
        "large": rows["large"],
        "ratio": round(ratio, 2),
        "cpu_ratio": round(cpu_ratio, 2),
        "target_ratio": TARGET_RATIO,
        "pass": ratio <= TARGET_RATIO,
    }


# --------------------------------------------------------------------------- profile


def profile_one(scenario: Path, pure: Path, stats: Path) -> None:
    # main(argv) given its argv returns (the console script's os._exit would lose the stats)
    code = (
        "import cProfile; from jupyter_gpuaas.cli import main; "
        f"cProfile.run(\"main(['simulate', {str(scenario)!r}, '--json'])\", {str(stats)!r})"
    )
    env = _bench.pure_env(pure)
    # cwd outside the repository: '' first on sys.path must not find the compiled tree
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=pure, capture_output=True, text=True
    )
    if proc.returncode != 0 or not stats.exists():
        raise SystemExit(f"profiling {scenario} failed:\n{proc.stderr[-3000:]}")


def per_function(stats: Path, requests: int) -> dict[str, tuple[float, float, int]]:
    """function -> (own µs per request, cumulative µs per request, calls per request x1000)."""
    st = pstats.Stats(str(stats))
    out: dict[str, tuple[float, float, int]] = {}
    for (file, line, name), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if "jupyter_gpuaas" not in file:
            continue
        key = f"{file.split('jupyter_gpuaas/')[-1]}:{line}({name})"
        out[key] = (1e6 * tt / requests, 1e6 * ct / requests, round(1000 * nc / requests))
    return out


def profile(out: Path, top: int = 25) -> dict[str, Any]:
    shapes = {"baseline": kueue_baseline.generate(out), "large": generate(out)}
    n = {"baseline": len(kueue_baseline.build()["requests"]), "large": len(build()["requests"])}
    with tempfile.TemporaryDirectory(prefix="kueue-large-prof-") as tmp:
        pure = _bench.pure_copy(Path(tmp))
        funcs = {}
        for k, p in shapes.items():
            stats = Path(tmp) / f"{k}.prof"
            profile_one(p, pure, stats)
            funcs[k] = per_function(stats, n[k])
    rows = []
    for key in set(funcs["baseline"]) | set(funcs["large"]):
        b = funcs["baseline"].get(key, (0.0, 0.0, 0))
        g = funcs["large"].get(key, (0.0, 0.0, 0))
        rows.append(
            {
                "function": key,
                "own_us_baseline": round(b[0], 2),
                "own_us_large": round(g[0], 2),
                "own_growth_us": round(g[0] - b[0], 2),
                "cum_us_baseline": round(b[1], 2),
                "cum_us_large": round(g[1], 2),
                "calls_per_1000_baseline": b[2],
                "calls_per_1000_large": g[2],
            }
        )
    rows.sort(key=lambda r: -r["own_growth_us"])
    total = {k: round(sum(v[0] for v in f.values()), 1) for k, f in funcs.items()}
    return {"own_us_per_request_total": total, "top": rows[:top]}


def text(r: dict[str, Any]) -> str:
    lines = ["Kueue shapes, whole `simulate` process, cost per request (best of runs)"]
    for k in ("baseline", "large"):
        x = r[k]
        t = x["timing"]
        lines.append(
            f"  {k:<8} {x['requests']:>6,} requests: {x['us_per_request']:.0f} µs/request"
            f" (median {x['us_per_request_median']:.0f}; CPU {x['cpu_us_per_request']:.0f};"
            f" core+driver {x['core_us_per_request']:.0f}); walls {t['walls']} s,"
            f" RSS {t['max_rss_mib']:.0f} MiB"
        )
    lines.append(
        f"  ratio    {r['ratio']} (CPU {r['cpu_ratio']}); target <= {r['target_ratio']}:"
        f" {'PASS' if r['pass'] else 'FAIL'}; load average {r['load_average']}"
    )
    if "profile" in r:
        p = r["profile"]
        lines.append(
            f"profile (pure Python, own µs per request): baseline"
            f" {p['own_us_per_request_total']['baseline']}, large"
            f" {p['own_us_per_request_total']['large']}; most grown:"
        )
        lines.append("  growth  baseline   large   calls/1000 b->l  function")
        for row in p["top"]:
            lines.append(
                f"  {row['own_growth_us']:>6.1f} {row['own_us_baseline']:>9.1f}"
                f" {row['own_us_large']:>7.1f}  {row['calls_per_1000_baseline']:>7}->"
                f"{row['calls_per_1000_large']:<7} {row['function']}"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the generated scenarios (benchmarks/generated)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (default 3)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--profile", action="store_true", help="also profile both (pure Python)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink the large shape's counts (smoke runs)"
    )
    parser.add_argument("--top", type=int, default=25, help="functions listed by --profile")
    args = parser.parse_args(argv)
    out = _bench.out_dir(args.out)
    r = measure(out, args.repeat, args.scale)
    if args.profile:
        r["profile"] = profile(out, args.top)
    _bench.emit(r, args.json, text(r))
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
