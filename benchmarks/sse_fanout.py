"""Fan-out (issue 40, item 5): 1,000 SSE clients that hear every event, 50 submits/s.

The load of `gateway_load.py` (a real gateway subprocess, open-loop submissions each
cancelled after 1-9 s, SSE deliveries counted against the decision log, release to next
admission) with every listener opened by a user with view rights, so each decision goes
to all 1,000 streams. Target: submit p99 under 50 ms. Before issue 40 the bus wrote every
stream every 10 ms, and the writes took the loop: p99 1,170 ms (21 ms without listeners).

The 1,000 listeners run in a process of their own (`--listener-process`, _sse_crowd.py):
read in the generator's process they took half a core there and made the submissions
themselves late by 80-180 ms at p99. `--in-process` puts them back there (the first
measurements of issue 40 were taken so).

    .venv/bin/python benchmarks/sse_fanout.py [--listeners N] [--rate R] [--duration S]
        [--in-process] [--json FILE] [gateway_load.py's other flags]

Prints gateway_load.py's JSON (`sse.streams` holds the gateway's own
`gpuaas_event_streams` and `gpuaas_event_streams_dropped_total`; `sse.resets_received`
the `reset` events the clients got when a stream was dropped for falling behind).
"""

from __future__ import annotations

import sys

# Run as a script, benchmarks/ is sys.path[0]: the sibling imports as a top-level module.
import gateway_load

DEFAULTS = {
    "--listeners": "1000",
    "--viewer-share": "1",
    "--rate": "50",
    "--duration": "30",
    "--probes": "10",
}


def main(argv: list[str]) -> int:
    args = list(argv)
    for flag, value in DEFAULTS.items():
        if not any(a == flag or a.startswith(flag + "=") for a in args):
            args += [flag, value]
    if "--in-process" in args:  # the listeners in the generator's own process, as before
        args.remove("--in-process")
    elif "--listener-process" not in args:
        args.append("--listener-process")
    return gateway_load.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
