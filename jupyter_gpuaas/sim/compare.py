"""`jupyter-gpuaas simulate compare A B` and `simulate --plot`: two runs side by side, and
a run drawn over time.

An admin's what-if is a difference: "with 8 more a100 for vision, research's p95 wait goes
from 2 h to 25 min, and nlp loses nothing". `compare` runs two scenarios (usually one
exported by `history export` and the same with `--set`) and prints, per tenant and for
everyone, the waits p50/p95, GPU-hours allocated, busy and idle, the busy share of what
was allocated, culls and preemptions, each with B - A.

The plots (matplotlib, the `plot` extra) draw what a table cannot: the wait distributions
of the two runs, and queue length and GPUs allocated over time, both read from the
decision stream (SCENARIO.md's events), so they show exactly what the simulator decided.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpuaas.sim.scenario import Scenario
from jupyter_gpuaas.words import format_duration

if TYPE_CHECKING:
    from jupyter_gpuaas.sim.progress import Progress

#: Per-tenant rows of the comparison, in the order they print: (key, heading, kind).
METRICS: tuple[tuple[str, str, str], ...] = (
    ("wait_p50", "wait p50", "seconds"),
    ("wait_p95", "wait p95", "seconds"),
    ("gpu_hours_allocated", "GPU-h allocated", "hours"),
    ("gpu_hours_busy", "GPU-h busy", "hours"),
    ("gpu_hours_idle", "GPU-h idle", "hours"),
    ("busy_share", "busy share", "share"),
    ("culls", "culls", "count"),
    ("preemptions", "preemptions", "count"),
)


@dataclass
class Run:
    """One scenario's simulation: its result object and its decisions (as JSON events)."""

    scenario: Scenario
    result: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)


def simulate(
    scenario: Scenario, until: float | None, keep_events: bool, progress: Progress | None = None
) -> Run:
    """Run a scenario through the core as `simulate` does; keep its events for plots;
    tell `progress` how far the clock has run (sim/progress.py)."""
    from jupyter_gpuaas.sim.driver import run_scenario
    from jupyter_gpuaas.sim.report import Tally

    sink = io.StringIO() if keep_events else None
    tally = Tally(scenario, sink, progress)
    started = time.perf_counter()
    sim = run_scenario(scenario, until=until if until is not None else scenario.until, tally=tally)
    wall = time.perf_counter() - started
    if progress is not None:
        progress.finish(sim.end)
    tally.flush()
    waiting_for = getattr(getattr(sim, "core", None), "waiting_for", None)
    result = tally.result(sim.end, wall, waiting_for)
    events = [json.loads(line) for line in sink.getvalue().splitlines()] if sink else []
    return Run(scenario, result, events)


def tenant_metrics(run: Run) -> dict[str, dict[str, float]]:
    """Per tenant (and "all"), the metrics of METRICS from one run's result."""
    summary = run.result["summary"]
    tenant_of = {r.id: r.tenant for r in run.scenario.requests}
    counts: dict[str, dict[str, float]] = {}
    for rid, r in run.result["requests"].items():
        c = counts.setdefault(tenant_of.get(rid, "?"), {"culls": 0.0, "preemptions": 0.0})
        c["culls"] += r.get("culls", 0)
        c["preemptions"] += r.get("preemptions", 0)
    out: dict[str, dict[str, float]] = {}
    rows: list[tuple[str, Mapping[str, Any]]] = list(summary.get("per_tenant", {}).items())
    rows.append(("all", summary))
    for name, t in rows:
        alloc = float(t.get("gpu_hours_allocated", 0.0))
        busy = float(t.get("gpu_hours_busy", 0.0))
        if name == "all":
            c = {
                "culls": float(summary.get("culls", 0)),
                "preemptions": float(summary.get("preemptions", 0)),
            }
        else:
            c = counts.get(name, {"culls": 0.0, "preemptions": 0.0})
        out[name] = {
            "wait_p50": float(t.get("wait_p50", 0.0)),
            "wait_p95": float(t.get("wait_p95", 0.0)),
            "gpu_hours_allocated": alloc,
            "gpu_hours_busy": busy,
            "gpu_hours_idle": max(0.0, alloc - busy),
            "busy_share": busy / alloc if alloc > 0 else 0.0,
            "culls": c["culls"],
            "preemptions": c["preemptions"],
        }
    return out


def compare(a: Run, b: Run) -> dict[str, Any]:
    """`--json` of `simulate compare`: per tenant, each metric's a, b and b - a."""
    ma, mb = tenant_metrics(a), tenant_metrics(b)
    names = [n for n in ma if n != "all"] + [n for n in mb if n not in ma and n != "all"]
    out: dict[str, Any] = {}
    for name in [*names, "all"]:
        ra, rb = ma.get(name, {}), mb.get(name, {})
        out[name] = {
            key: {
                "a": round(ra.get(key, 0.0), 4),
                "b": round(rb.get(key, 0.0), 4),
                "diff": round(rb.get(key, 0.0) - ra.get(key, 0.0), 4),
            }
            for key, _, _ in METRICS
        }
    return {"per_tenant": out}


def _cell(value: float, kind: str, signed: bool = False) -> str:
    sign = ("+" if value > 0 else "-" if value < 0 else "±") if signed else ""
    v = abs(value) if signed else value
    if kind == "seconds":
        return sign + format_duration(v)
    if kind == "hours":
        return f"{sign}{v:.2f}" if v < 10 else f"{sign}{v:.1f}"
    if kind == "share":
        return f"{sign}{100 * v:.0f}%"
    return f"{sign}{v:.0f}"


def format_compare(table: Mapping[str, Any], a_name: str, b_name: str) -> str:
    """The comparison as a table a person reads: a row per tenant and metric."""
    lines = [f"A: {a_name}", f"B: {b_name}", ""]
    rows: list[tuple[str, str, str, str, str]] = []
    for tenant, metrics in table["per_tenant"].items():
        for key, heading, kind in METRICS:
            m = metrics[key]
            diff = _cell(m["diff"], kind, signed=True) if m["diff"] else "same"
            rows.append((tenant, heading, _cell(m["a"], kind), _cell(m["b"], kind), diff))
    headers = ("tenant", "metric", "A", "B", "B - A")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines.append(
        "  ".join(
            h.ljust(w) if i < 2 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    )
    lines.append("  ".join("-" * w for w in widths))
    last = ""
    for r in rows:
        cells = (r[0] if r[0] != last else "", *r[1:])
        last = r[0]
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines) + "\n"


# --- over time, from the decision stream --------------------------------------------------


def timeline(events: Iterable[Mapping[str, Any]]) -> tuple[list[float], list[int], list[int]]:
    """(times, requests queued, GPUs allocated) after each instant of the decision stream."""
    queued: set[str] = set()
    held: dict[str, int] = {}
    size: dict[str, int] = {}
    times: list[float] = []
    q: list[int] = []
    g: list[int] = []
    for e in events:
        rid = e.get("id")
        ev = e["event"]
        if rid is not None:
            if ev == "submit":
                queued.add(rid)
                size[rid] = int(e.get("gpus", 0))
            elif ev in ("admit", "resume"):
                queued.discard(rid)
                held[rid] = int(e.get("gpus", size.get(rid, 0)))
            elif ev == "requeue":
                queued.add(rid)
                held.pop(rid, None)
            elif ev in ("preempt", "cull", "finish", "cancel", "reject", "expire"):
                if ev != "cull" or not e.get("parked"):
                    queued.discard(rid)
                held.pop(rid, None)
        t = float(e["t"])
        if times and times[-1] == t:
            q[-1], g[-1] = len(queued), sum(held.values())
        else:
            times.append(t)
            q.append(len(queued))
            g.append(sum(held.values()))
    return times, q, g


def _waits(run: Run) -> list[float]:
    return sorted(
        float(r["wait"]) / 60.0
        for r in run.result["requests"].values()
        if r.get("admitted_at") is not None
    )


def plot(runs: Sequence[tuple[str, Run]], path: str) -> None:
    """Draw the runs into a PNG: queue length and GPUs allocated over time, and the
    distribution of waits (minutes) of each. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    fig, (ax_q, ax_g, ax_w) = plt.subplots(3, 1, figsize=(9, 9), constrained_layout=True)
    for label, run in runs:
        times, queued, gpus = timeline(run.events)
        hours = [t / 3600.0 for t in times]
        ax_q.step(hours, queued, where="post", label=label)
        ax_g.step(hours, gpus, where="post", label=label)
        waits = _waits(run)
        if waits:
            share = [(i + 1) / len(waits) for i in range(len(waits))]
            ax_w.step(waits, share, where="post", label=label)
    ax_q.set(title="requests waiting", xlabel="hours", ylabel="requests")
    ax_g.set(title="GPUs allocated", xlabel="hours", ylabel="GPUs")
    ax_w.set(
        title="waits (share of admitted requests that waited at most x)",
        xlabel="minutes",
        ylabel="share",
    )
    for ax in (ax_q, ax_g, ax_w):
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend()
    fig.savefig(path, dpi=100)
    plt.close(fig)
