"""The wait estimates' backtest on the month trace, with the accuracy by kind and by day.

`jupyter-gpuaas simulate month.json --estimates N --json` gives the overall accuracy; this
runs the same replay (`run_scenario` with the CLI's `Backtest`) and also writes one JSON
line per estimate made (request, kind, tenant, when, the forward run's uncalibrated
middle `raw` and the estimate shown) and per outcome (when an estimated request started),
as they happen, so a long run killed half-way still says how it went, and a calibration
can be replayed over the recorded runs without running them again. The last line holds
the CLI's summary and every sampled request's wait.

    cd benchmarks && python month_trace.py --out /tmp/m   # writes /tmp/m/month.json
    PYTHONPATH=.. python estimate_backtest.py /tmp/m/month.json --every 100 --out est.jsonl
    python estimate_backtest.py --report est.jsonl

The report judges what the CLI judges: requests of the sampled instants that started
after waiting at least 5 min; median relative error, share inside the range, share with
an estimate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

DAY = 86400.0
LONG_WAIT = 300.0


def run(
    scenario_path: Path,
    every: int,
    out: IO[str],
    until: float | None,
    offset: int = 0,
    every_spell: bool = False,
) -> dict[str, Any]:
    import jupyter_gpuaas.sim.backtest as backtest_module
    from jupyter_gpuaas.admission.core import AdmissionCore
    from jupyter_gpuaas.admission.model import Decision
    from jupyter_gpuaas.sim.driver import run_scenario
    from jupyter_gpuaas.sim.report import Tally
    from jupyter_gpuaas.sim.scenario import load_scenario

    scenario = load_scenario(scenario_path)
    estimate_waits = backtest_module.estimate_waits

    class Recorded(backtest_module.Backtest):
        """The CLI's backtest, each estimate and outcome written to `out` as it happens."""

        def observe(self, decisions: list[Decision]) -> None:
            for d in decisions:
                if d.id in self.pending and d.event in ("admit", "resume"):
                    out.write(json.dumps({"o": d.id, "t": d.t}) + "\n")
            super().observe(decisions)

        def at_submit(self, core: AdmissionCore, now: float, arrived: list[str]) -> None:
            def recorded(*args: Any, **kwargs: Any) -> Any:
                made = estimate_waits(*args, **kwargs)
                for rid, est in made.items():
                    req = core.get(rid)
                    line = {
                        "e": rid,
                        "kind": req.kind if req else "",
                        "tenant": req.tenant if req else "",
                        "now": now,
                        "raw": est.raw,
                        "sec": est.seconds,
                        "low": est.low,
                        "high": est.high,
                        "cal": est.calibrated,
                    }
                    out.write(json.dumps(line) + "\n")
                return made

            # The backtest calls the module's estimate_waits: recorded around it, for
            # this call only.
            backtest_module.estimate_waits = recorded  # type: ignore[assignment]
            try:
                super().at_submit(core, now, arrived)
            finally:
                backtest_module.estimate_waits = estimate_waits

    bt = Recorded(scenario, every, offset)
    tally = Tally(scenario, None, None)
    started = time.perf_counter()
    sim = run_scenario(scenario, until=until, tally=tally, backtest=bt, every_spell=every_spell)
    wall = time.perf_counter() - started
    result = tally.result(sim.end, wall, None)
    bt.apply(result)
    waits = {
        rid: (r.get("wait"), r.get("admitted_at"))
        for rid, r in result["requests"].items()
        if rid in bt.eta
    }
    summary: dict[str, Any] = result["summary"]["estimates"]
    out.write(json.dumps({"summary": summary, "wall": wall, "waits": waits}) + "\n")
    return summary


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def report(path: Path) -> str:
    """The accuracy by kind and by day of a recorded run (complete or not: without the
    last line, the waits are those of the outcomes recorded so far)."""
    shown: dict[str, dict[str, Any]] = {}
    waits: dict[str, tuple[float | None, float | None]] = {}
    summary = None
    for d in _lines(path):
        if "e" in d:
            shown[d["e"]] = d
        elif "o" in d and d["o"] in shown:
            waits.setdefault(d["o"], (d["t"] - shown[d["o"]]["now"], d["t"]))
        elif "summary" in d:
            summary = d["summary"]
            waits = {k: (v[0], v[1]) for k, v in d["waits"].items()}
    rows = []

    def line(name: str, ids: list[str]) -> None:
        errors, inside, judged = [], 0, 0
        for rid in ids:
            wait, started = waits.get(rid, (None, None))
            if started is None or wait is None or wait < LONG_WAIT:
                continue
            judged += 1
            e = shown[rid]
            if e["sec"] is None:
                continue
            errors.append(abs(e["sec"] - wait) / wait)
            inside += e["low"] <= wait and (e["high"] is None or wait <= e["high"])
        if not judged:
            return
        n = len(errors)
        err = f"{statistics.median_low(errors) * 100:.1f}%" if errors else "n/a"
        share = f"{inside / n * 100:.1f}%" if n else "n/a"
        rows.append(f"| {name} | {judged} | {n / judged * 100:.0f}% | {err} | {share} |")

    ids = list(shown)
    line("all", ids)
    for kind in ("kernel", "server", "job"):
        line(f"{kind}s", [r for r in ids if shown[r]["kind"] == kind])
    line("days 1-29 (a yesterday to forecast from)", [r for r in ids if shown[r]["now"] >= DAY])
    days = int(max((shown[r]["now"] for r in ids), default=0.0) // DAY) + 1
    for week in range(0, days, 7):
        span = [r for r in ids if week * DAY <= shown[r]["now"] < (week + 7) * DAY]
        line(f"days {week}-{min(week + 6, days - 1)}", span)
    head = "| slice | judged | predicted | median relative error | inside the range |\n"
    head += "|---|---|---|---|---|\n"
    tail = f"\nCLI summary: {json.dumps(summary)}" if summary else "\n(incomplete run)"
    return head + "\n".join(rows) + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", type=Path)
    ap.add_argument("--every", type=int, default=100, help="estimate one arrival instant in N")
    ap.add_argument("--until", type=float, help="stop the clock here (seconds)")
    ap.add_argument("--offset", type=int, default=0, help="sample other instants (a second sample)")
    ap.add_argument("--out", type=Path, default=Path("estimates.jsonl"))
    ap.add_argument(
        "--quiet-spells",
        action="store_true",
        help="tell the core only the idle spells that change a decision (the replay before"
        " 2026-12-07, faster); by default it hears every one, as a gateway does and as"
        " `simulate --estimates` replays",
    )
    ap.add_argument("--report", type=Path, help="only report on a recorded run")
    args = ap.parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    if args.scenario is None:
        ap.error("give a scenario, or --report FILE")
    with args.out.open("w", encoding="utf-8", buffering=1) as out:
        every_spell = not args.quiet_spells
        summary = run(args.scenario, args.every, out, args.until, args.offset, every_spell)
        print(json.dumps(summary))
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
