"""What a set of forward-run wait estimates costs (issue 43 item 1).

Replays the month trace (benchmarks/month_trace.py: ~1,000 GPUs, 13 tenants) to a busy
weekday moment, with the history and the arrival forecast a gateway would have by then,
and times
`estimate_waits` there: one set of three forward runs gives every queued request its
estimate, and the gateway keeps the set until its next decision (gateway/estimates.py).
Reports the live and queued requests, the time per set (best and median of `--repeat`)
and per queued request, and how many forward-run events the budget allowed.

    .venv/bin/python benchmarks/estimate_cost.py [--at 218000] [--requests 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _bench
import month_trace

from jupyter_gpuaas.admission.estimate import estimate_waits, forecast
from jupyter_gpuaas.admission.model import State
from jupyter_gpuaas.gateway.estimates import HORIZON, MAX_EVENTS
from jupyter_gpuaas.sim.backtest import Backtest
from jupyter_gpuaas.sim.driver import run_scenario
from jupyter_gpuaas.sim.scenario import load_scenario


def measure(at: float, requests: int, repeat: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        scenario = load_scenario(month_trace.generate(Path(tmp), requests))
    # History only: one arrival instant in a billion is estimated (the first). Every idle
    # spell told, as a gateway hears them: its idle holders and its history of spells.
    backtest = Backtest(scenario, every=10**9)
    sim = run_scenario(scenario, until=at, backtest=backtest, every_spell=True)
    core = sim.core
    live = list(core.live_requests())
    queued = [r for r in live if r.state is State.QUEUED]
    times = []
    made = {}
    for _ in range(repeat):
        started = time.perf_counter()
        made = estimate_waits(
            core, at, backtest.history, horizon=HORIZON, max_events=MAX_EVENTS,
            calibration=backtest.calibration, arrivals=forecast(backtest.arrived, at),
        )  # fmt: skip
        times.append(time.perf_counter() - started)
    with_estimate = sum(1 for e in made.values() if e.seconds is not None)
    best = min(times)
    return {
        "machine": _bench.machine(),
        "core": _bench.core_build(),
        "at": at,
        "live_requests": len(live),
        "queued": len(queued),
        "with_estimate": with_estimate,
        "history": len(backtest.history),
        "forecast_arrivals": len(forecast(backtest.arrived, at)),
        "set_ms_best": round(best * 1000, 1),
        "set_ms_median": round(statistics.median(times) * 1000, 1),
        "per_queued_ms": round(best * 1000 / max(1, len(queued)), 2),
        "max_events": MAX_EVENTS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=float, default=2 * 86400 + 14 * 3600.0)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    result = measure(args.at, args.requests, args.repeat)
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
