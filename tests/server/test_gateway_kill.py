"""`kill -9` of the gateway while GPU kernels start, against real processes: a jupyter_server
with the extension and GPU kernelspecs, and a gateway subprocess (simulated devices: one
node of two a100, vision's quota 2) killed with SIGKILL and started again on the same
port and store.

Four one-GPU kernels are started at once: two are admitted (and launching), two queue.
The gateway is killed. A kernel started while it is down fails at once, saying it
cannot reach the gateway (503), instead of hanging. After the restart every start
settles within a bound: the two kernels run on their grants and the two wait on the
same requests, which start as the running ones are shut down; nobody is left waiting
forever. At every step no device is held by two requests, and each live kernel runs
on the devices the gateway says its request holds.

Unmarked coroutine tests, as in test_gpu_kernels.py: pytest-jupyter runs them on the
server's loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gwutil import launch_gateway
from helpers import free_port
from helpers import wait_until as wait_for
from srvutil import ADMIN_TOKEN, TOKEN, GatewayProc, gateway_command
from test_gpu_kernels import ENV_CODE, gpu_kernels, kernel_ready, run_code, start_kernel
from tornado.httpclient import HTTPClientError

pytestmark = pytest.mark.slow

BOUND = 60  # seconds within which every kernel start completes or fails


class Restartable:
    """The gateway subprocess, started again on the same port and SQLite store."""

    def __init__(self, root: Path) -> None:
        self.root, self.port, self.starts = root, free_port(), 0
        self.gw: GatewayProc | None = None

    def start(self) -> GatewayProc:
        self.starts += 1
        gw = launch_gateway(
            self.root,
            None,
            "--lease-ttl=15",
            port=self.port,
            quotas={
                "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
                "tenants": {"vision": {"quota": {"a100": 2}}},
                "policy": {"idle_timeout": 0, "reservation_ttl": 0, "cull_warning": 0},
            },
            tokens={
                "tokens": {
                    TOKEN: {"user": "alice", "groups": ["vision"]},
                    ADMIN_TOKEN: {"user": "root", "groups": [], "admin": True},
                }
            },
            devices="simulated:a100=1x2",
            command=gateway_command(),
            log=self.root / f"gateway-{self.starts}.log",
            kind=GatewayProc,
        )
        assert isinstance(gw, GatewayProc)
        self.gw = gw
        return self.gw


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProc]:
    """Overrides conftest's: jp_server_config points the extension at this one."""
    root = tmp_path / "gateway"
    root.mkdir()
    restartable = Restartable(root)
    gw = restartable.start()
    gw.restartable = restartable  # type: ignore[attr-defined]
    yield gw
    assert restartable.gw is not None
    restartable.gw.stop()


def holders(gw: GatewayProc) -> dict[str, list[int]]:
    """Request id → the devices the gateway says it holds; fails if two hold one."""
    out: dict[str, list[int]] = {}
    for d in gw.call("GET", "api/devices")["devices"]:
        if d["holder"]:
            out.setdefault(d["holder"]["id"], []).append(d["index"])
    admitted = gw.call("GET", "api/requests?state=admitted")
    held = [(r["grant"]["node"], i) for r in admitted for i in r["grant"]["devices"]]
    assert len(held) == len(set(held)), admitted  # no device granted twice
    assert {r["id"]: sorted(r["grant"]["devices"]) for r in admitted} == out
    return out


async def settled(app: Any, jp_fetch: Any, gw: GatewayProc, kids: list[str]) -> dict[str, str]:
    """Each kernel's outcome once none is between states: running (alive, on the devices
    its request holds), queued (waiting, its request queued) or failed (with a reason)."""
    held = holders(gw)
    records = {k["kernel_id"]: k for k in await gpu_kernels(jp_fetch)}
    out: dict[str, str] = {}
    for kid in kids:
        rec = records.get(kid)
        if rec is None:
            return {}
        if rec["state"] == "running" and kernel_ready(app, kid)():
            assert held.get(rec["request_id"]) == rec["devices"], (rec, held)
            out[kid] = "running"
        elif rec["state"] == "queued" and gw.request(rec["request_id"])["state"] == "queued":
            out[kid] = "queued"
        elif rec["state"] == "failed" and rec["reason"]:
            out[kid] = "failed: " + rec["reason"]
        else:
            return {}  # still on its way
    return out


async def test_kernel_starts_survive_kill_9_of_the_gateway(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    kids = [await start_kernel(jp_fetch, "gpu1") for _ in range(4)]

    def split() -> bool:  # two admitted (their kernels launching), two queued
        states = [r["state"] for r in gateway.call("GET", "api/requests?user=alice")]
        return sorted(states) == ["admitted", "admitted", "queued", "queued"]

    await wait_for(split, 30, "two kernels admitted and two queued")
    gateway.proc.kill()  # SIGKILL, with two kernels launching and two waiting
    gateway.proc.wait(10)
    # A start while the gateway is down does not hang: the client retries an unreachable
    # gateway with the request's Idempotency-Key (a few seconds), and the start is
    # answered within `submit_wait` (5 s): refused saying why, or pending while it retries.
    # Either way the kernel is removed again, so that the four above are the whole story.
    began = time.monotonic()
    try:
        resp = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpu1"}))
    except HTTPClientError as e:
        assert e.code == 503, e
        assert "cannot reach the gateway" in json.loads(e.response.body)["message"]
    else:
        extra = json.loads(resp.body)["id"]
        await jp_fetch("api", "kernels", extra, method="DELETE")
    assert time.monotonic() - began < 15
    # Down for a few polls of the waiting kernels (poll_interval 0.5 s, conftest.py): a
    # duration, not a condition, is what this test is about.
    await asyncio.sleep(2.0)
    gw = gateway.restartable.start()  # type: ignore[attr-defined]

    outcome = await wait_for(
        lambda: settled(gpu_app, jp_fetch, gw, kids), BOUND, "every start to settle"
    )
    print(f"after kill -9 and restart: {sorted(outcome.values())}")
    # What the store had stays as it was: two kernels run on their grants, two wait.
    assert sorted(outcome[k] for k in kids) == ["queued", "queued", "running", "running"]
    # The waiting ones are not stuck behind the dead gateway: as GPUs free, they start.
    running = [k for k in kids if outcome[k] == "running"]
    queued = [k for k in kids if outcome[k] == "queued"]
    for kid in running:
        await jp_fetch("api", "kernels", kid, method="DELETE")

    async def started() -> dict[str, str]:
        out = await settled(gpu_app, jp_fetch, gw, queued)
        return out if set(out.values()) == {"running"} else {}

    await wait_for(started, BOUND, "the waiting kernels to start once the running ones stopped")
    # Each runs on its own device, as its own environment says.
    seen = [(await run_code(gpu_app, kid, ENV_CODE)).split()[0] for kid in queued]
    records = {k["kernel_id"]: k for k in await gpu_kernels(jp_fetch)}
    assert seen == [str(records[kid]["devices"][0]) for kid in queued]
    assert sorted(seen) == ["0", "1"]
