"""What `GET api/advice` costs on a large store, and so why it is bounded (issue 43 item 4;
gateway/advice_cache.py).

Writes the how-to's sample week (tests/history_sample.py: two tenants, one queueing behind
its quota while the other's sits idle) `--weeks` times over, with `--scale` copies of its
users and quotas, into a fresh SQLite store, then times what one uncached `api/advice`
does: read the period's rows (`read_history`) and advise (`advise_from_store`: the
replay, plus one what-if replay per idle quota). Prints JSON: requests, and the seconds
of each of `--repeat` calls (the first also imports the simulator, as a gateway's first
`api/advice` does).

    .venv/bin/python benchmarks/advice_cost.py [--weeks 52] [--scale 8] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from history_sample import quotas_yaml, write_sample_store

from jupyter_gpuaas.gateway.advice import advise_from_store
from jupyter_gpuaas.gateway.history import read_history


def measure(weeks: int, scale: int, repeat: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'gpuaas.sqlite'}"
        now = time.time()
        n = write_sample_store(url, now, weeks=weeks, scale=scale)
        quotas = yaml.safe_load(quotas_yaml(scale))
        span = weeks * 7 * 86400.0 + 3600
        reads, advices = [], []
        out: dict[str, object] = {}
        for _ in range(repeat):
            t0 = time.perf_counter()
            read_history(url, now - span, None)
            reads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = advise_from_store(url, quotas, span, min_grants=10)
            advices.append(time.perf_counter() - t0)
    return {
        "weeks": weeks,
        "scale": scale,
        "requests": n,
        # The first call also imports the simulator (a gateway's first api/advice does).
        "read_s": [round(x, 2) for x in reads],
        "advice_s": [round(x, 2) for x in advices],
        "advice": len(out.get("advice", [])),  # type: ignore[arg-type]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weeks", type=int, default=52)
    parser.add_argument("--scale", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(measure(args.weeks, args.scale, args.repeat)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
