"""Spawn time through a real JupyterHub: a queued spawn that finds a free GPU, against the
plain spawner it wraps, side by side in one run.

Two hubs run at once from the same generated config (tests/hub/conftest.py: the demo's
hub_config/local/jupyterhub_config.py with CHP, the gateway service and simulated
devices). One uses `QueuedSimpleLocalProcessSpawner`, the other plain
`SimpleLocalProcessSpawner`. Each round starts alice's server on both (interleaved, so
machine noise hits both alike) and times `POST /hub/api/users/alice/server` until the Hub
answers 201 (server started and answering), then stops both. Also timed: the queued
spawner with `gpus: 0` (the mixin without the queue). Target: the queued median is at
most 150 ms slower than the plain one.

    .venv/bin/python benchmarks/hub_spawn.py [--rounds 10] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGET_MS = 150.0


def _hub_class() -> Any:
    spec = importlib.util.spec_from_file_location(
        "hub_conftest", REPO / "tests" / "hub" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Hub


def timed_spawn(hub: Any, options: dict[str, Any]) -> float:
    started = time.perf_counter()
    resp = hub.spawn("alice", options)
    elapsed = time.perf_counter() - started
    if resp.status_code != 201:
        raise SystemExit(f"spawn answered {resp.status_code}: {resp.text}\n{hub.log()}")
    return elapsed


def stop(hub: Any) -> None:
    hub.stop_server("alice")
    hub.wait_stopped("alice")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    Hub = _hub_class()
    times: dict[str, list[float]] = {"plain": [], "queued_gpu": [], "queued_0": []}
    with tempfile.TemporaryDirectory() as tmp:
        plain = Hub(
            Path(tmp) / "plain",
            'c.JupyterHub.spawner_class = "simple"\n'
            "c.SimpleLocalProcessSpawner.options_form = ''\n",
        )
        queued = Hub(Path(tmp) / "queued")
        for hub in (plain, queued):
            hub.root.mkdir()
            hub.start()
        try:
            for hub, options in (  # warm-up: first spawns create users' homes
                (plain, {}),
                (queued, {"tenant": "vision", "gpus": 1}),
            ):
                timed_spawn(hub, options)
                stop(hub)
            for _ in range(args.rounds):
                times["plain"].append(timed_spawn(plain, {}))
                stop(plain)
                times["queued_gpu"].append(timed_spawn(queued, {"tenant": "vision", "gpus": 1}))
                stop(queued)
                times["queued_0"].append(timed_spawn(queued, {"gpus": 0}))
                stop(queued)
            # The Hub's own measure of the queue's share: submit to admission, inside it.
            log = queued.log_path.read_text(errors="replace")
            inside = [float(x) for x in re.findall(r"queueing took ([0-9.]+) ms", log)]
        finally:
            plain.stop()
            queued.stop()
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    queueing = statistics.median(inside[1:]) if len(inside) > 1 else None
    delta = med["queued_gpu"] - med["plain"]
    result = {
        "benchmark": "hub_spawn",
        "rounds": args.rounds,
        "median_ms": {k: round(v, 1) for k, v in med.items()},
        "all_ms": {k: [round(x * 1000, 1) for x in v] for k, v in times.items()},
        "overhead_ms": round(delta, 1),
        "queueing_ms_median": None if queueing is None else round(queueing, 1),
        "target_ms": TARGET_MS,
        "ok": delta <= TARGET_MS,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"spawn until ready, median of {args.rounds} (ms):")
        print(f"  plain SimpleLocalProcessSpawner     {med['plain']:8.1f}")
        print(f"  queued, 1 free GPU                  {med['queued_gpu']:8.1f}")
        print(f"  queued, gpus: 0 (no queue)          {med['queued_0']:8.1f}")
        if queueing is not None:
            print(f"  inside the Hub: submit to admission  {queueing:8.1f}")
        verdict = "PASS" if result["ok"] else "FAIL"
        print(f"  overhead of the queue {delta:+.1f} ms (target <= {TARGET_MS:.0f}): {verdict}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
