"""A gateway frozen past the lease TTL keeps the grant of every holder that heartbeat on
time (issue 40, item 1), and a holder that really died still loses its grant.

Real process, real SIGSTOP/SIGCONT: the gateway is stopped for twice the TTL while two
holders keep sending heartbeats (theirs wait in the kernel's socket buffers, as a real
client's would); a third holder stops heartbeating when the gateway freezes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from faultutil import Freezer
from gwutil import GatewayProcess, call
from helpers import wait_for

pytestmark = pytest.mark.slow  # a process frozen for seconds, on purpose

TTL = 4.0


def test_frozen_gateway_keeps_leases_of_holders_that_heartbeat(
    spawn: Callable[..., GatewayProcess], freezer: Freezer, tmp_path: Path
) -> None:
    gw = spawn(f"sqlite:///{tmp_path / 'gpuaas.sqlite'}", f"--lease-ttl={TTL}")
    ids = []
    for _ in range(3):
        status, req, _ = call(
            gw.url, "POST", "api/requests", {"tenant": "vision", "kind": "kernel", "gpus": 1}
        )
        assert status == 201 and req["state"] == "admitted", req
        ids.append(req["id"])
    live, dead = ids[:2], ids[2]

    stop = threading.Event()
    answers: dict[str, list[int]] = {rid: [] for rid in live}

    def holder(rid: str) -> None:
        # A heartbeat every TTL/4, each waiting as long as it takes (a frozen gateway's
        # kernel keeps the request until the process runs again).
        while not stop.is_set():
            status, _, _ = call(
                gw.url, "POST", f"api/requests/{rid}/heartbeat", {"busy": True}, timeout=60
            )
            answers[rid].append(status)
            stop.wait(TTL / 4)

    threads = [threading.Thread(target=holder, args=(rid,), daemon=True) for rid in live]
    for t in threads:
        t.start()
    wait_for(lambda: all(answers[rid] for rid in live), TTL, "each holder's first heartbeat")

    freezer.stop(gw.proc.pid)
    time.sleep(2 * TTL)  # frozen past the TTL: every lease is "expired" by the wall clock
    freezer.resume()

    # Half a TTL running again, its lease sweeps included: a duration, not a condition.
    time.sleep(TTL / 2)
    for rid in live:
        status, req, _ = call(gw.url, "GET", f"api/requests/{rid}")
        assert status == 200 and req["state"] == "admitted", req
    stop.set()
    for t in threads:
        t.join(70)
    for rid in live:
        assert answers[rid] and set(answers[rid]) == {200}, (rid, answers[rid])

    # The holder that died with the freeze loses its grant within a TTL or so.
    wait_for(
        lambda: call(gw.url, "GET", f"api/requests/{dead}")[1]["state"] == "finished",
        4 * TTL,
        "the grant of a holder that stopped heartbeating ends",
    )
    status, req, _ = call(gw.url, "GET", f"api/requests/{dead}")
    assert req["reason"] == "lease expired", req
    # And the extension was committed: the store's leases are the extended ones.
    for rid in live:
        status, req, _ = call(gw.url, "GET", f"api/requests/{rid}")
        assert req["state"] == "admitted", req
