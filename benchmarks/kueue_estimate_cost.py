"""What a set of wait estimates costs in Kueue mode (issue 43 item 1, issue 42 item 2).

In Kueue mode the forward runs start from a core made from Kueue's state
(admission/from_kueue.py `kueue_core_steps`), made when a set of estimates is made
(gateway/estimates.py). This times, at N pending Workloads, with the quota full:
- the core's making (`build`), and the part of it done before its first step (`read`:
  the requests read and copied at once, the one part not cut into slices);
- the whole set as the gateway makes it (`set`: the core made, then the three runs with
  the gateway's horizon, events and clock budget), and its longest step between two
  yields (`longest_step`: what one slice can take at worst);
- how long the gateway keeps such a set after a change (`kept_s`, estimates.kept_for):
  the estimates' share of the event loop is at most about set / (set + kept).

The shape: 30 tenants of one cohort, 2 GPUs of one flavor each (as
benchmarks/kueue_submit_cost.py's), every tenant's quota held by two jobs, and the
pending Workloads spread over the tenants, jobs and kernels, with a day of past grants.

    PYTHONPATH=$PWD/.. ../.venv/bin/python kueue_estimate_cost.py [--pending 100,1000,6000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import _bench

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.estimate import History, estimate_steps
from jupyter_gpuaas.admission.from_kueue import kueue_core_steps
from jupyter_gpuaas.admission.model import Config, Request, State
from jupyter_gpuaas.gateway.estimates import BUDGET, HORIZON, MAX_EVENTS, kept_for


def shape(tenants: int, pending: int, now: float) -> tuple[Config, list[Request], list[Request]]:
    config = parse_config({
        "flavors": {"a100": {"nodes": tenants, "gpus_per_node": 2}},
        "tenants": {f"t{i:02d}": {"quota": {"a100": 2}, "cohort": "all"} for i in range(tenants)},
        "policy": {"idle_timeout": 1800},
    })  # fmt: skip
    admitted = [
        Request(f"h{i:03d}-{j}", f"t{i:02d}", f"u{i}", "job", 1, now - 3000.0,
                state=State.ADMITTED, queue_time=now - 3000.0, assigned_flavor="a100",
                first_admit=now - 1200.0 * (j + 1), admit_time=now - 1200.0 * (j + 1))
        for i in range(tenants) for j in range(2)
    ]  # fmt: skip
    queued = [
        Request(f"p{k:05d}", f"t{k % tenants:02d}", f"u{k % 97}",
                "kernel" if k % 3 == 0 else "job", 1, now - pending + k,
                queue_time=now - pending + k)
        for k in range(pending)
    ]  # fmt: skip
    return config, admitted, queued


def history(now: float) -> History:
    past = History()
    for k in range(2000):
        kind = "kernel" if k % 3 == 0 else "job"
        past.add(kind, f"u{k % 97}", 600.0 + (k * 37) % 14400, at=now - 86000.0 + 40 * k)
    return past


def measure(pending: int, tenants: int, repeat: int) -> dict[str, Any]:
    now = 1_800_000_000.0
    config, admitted, queued = shape(tenants, pending, now)
    positions = {r.id: i + 1 for i, r in enumerate(queued)}
    past = history(now)
    builds, reads, sets, longest = [], [], [], []
    estimated = 0
    for _ in range(repeat):
        steps = kueue_core_steps(config, admitted, queued, now, positions=positions)
        started = time.perf_counter()
        read = None
        try:
            while True:
                next(steps)
                if read is None:
                    read = time.perf_counter() - started
        except StopIteration as done:
            core = done.value
        builds.append(time.perf_counter() - started)
        reads.append(read if read is not None else builds[-1])

        # The set as the gateway makes it: the core, then the runs, on a clock.
        def made(now: float = now) -> Any:
            core = yield from kueue_core_steps(config, admitted, queued, now,
                                               positions=positions)  # fmt: skip
            return (yield from estimate_steps(
                core, now, past, horizon=HORIZON, max_events=MAX_EVENTS,
                clock=time.perf_counter, budget=BUDGET,
            ))  # fmt: skip

        gen = made()
        started = last = time.perf_counter()
        worst = 0.0
        try:
            while True:
                next(gen)
                t = time.perf_counter()
                worst, last = max(worst, t - last), t
        except StopIteration as done:
            out = done.value
            t = time.perf_counter()
            worst = max(worst, t - last)
        sets.append(t - started)
        longest.append(worst)
        estimated = sum(1 for e in out.values() if e.seconds is not None)
        assert len(list(core.live_requests())) == len(admitted) + len(queued)
    best_set = min(sets)
    return {
        "pending": pending,
        "admitted": len(admitted),
        "build_ms_median": round(statistics.median(builds) * 1000, 1),
        "read_ms_median": round(statistics.median(reads) * 1000, 1),
        "set_ms_median": round(statistics.median(sets) * 1000, 1),
        "longest_step_ms": round(max(longest) * 1000, 1),
        "with_estimate": estimated,
        "kept_s": round(kept_for(best_set), 2),
        "loop_share_max": round(best_set / (best_set + kept_for(best_set)), 3)
        if kept_for(best_set)
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", default="100,1000,6000")
    parser.add_argument("--tenants", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    rows = [measure(int(n), args.tenants, args.repeat) for n in args.pending.split(",")]
    json.dump({"machine": _bench.machine(), "core": _bench.core_build(), "rows": rows},
              sys.stdout, indent=1)  # fmt: skip
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
