"""`jupyter-gpuaas demo` starts and stops as a whole (issue 14 item 6), as real processes.

- The banner comes once the Hub and the gateway answer through the public URL, and a
  machine without NVML gets one line about simulated GPUs, no NVML alarm.
- SIGTERM of the demo stops every process it started (Hub, proxy, gateway, alice's
  server) and frees every port they listened on; alice's grant is released and bob's
  pending spawn cancelled before the gateway stops, so a restarted demo shows no phantom
  holder and no orphaned queued request.
- Two demos run side by side on different --port; a taken port, or a state directory in
  use by another demo, is named in one line and exits 2.
- The demo runs from an empty working directory: it finds its shipped config by itself.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest
import requests
from demo_run import DEMO, PASSWORD, DemoRun, port_free
from helpers import free_port, wait_for
from hubutil import need_proxy

from jupyter_gpuaas.hub.demo import FAST_IDLE

pytestmark = pytest.mark.slow


@pytest.fixture
def demo(tmp_path: Path):  # type: ignore[no-untyped-def]
    need_proxy()
    runs: list[DemoRun] = []

    def make(*extra: str, name: str = "demo") -> DemoRun:
        run = DemoRun(tmp_path, *extra, name=name)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.kill_all()


def test_sigterm_stops_everything_and_releases_the_grant(demo) -> None:  # type: ignore[no-untyped-def]
    first = demo("--devices", "simulated:a100=1x4")  # the shipped quotas' four GPUs
    first.start()
    # Once the banner is out, the public URL answers: the Hub and the gateway's route.
    assert requests.get(f"{first.url}/hub/login", timeout=10).status_code == 200
    openapi = f"{first.url}/services/gpuaas/api/openapi.json"
    assert requests.get(openapi, timeout=10).status_code == 200

    # alice takes all four GPUs (two borrowed from nlp): three for her server and one for a
    # GPU kernel in it; bob's spawn then waits in the queue.
    resp = first.api("alice", "POST", "/users/alice/server", json={"tenant": "vision", "gpus": 3})
    assert resp.status_code in (201, 202), resp.text
    server = first.wait_ready("alice")
    resp = requests.post(
        f"{first.url}/user/alice/api/kernels",
        json={"name": "python3-gpu"},
        headers={"Authorization": f"token {first.token('alice')}"},
        timeout=60,
    )
    assert resp.status_code == 201, resp.text
    wait_for(
        lambda: len([d for d in first.gateway("alice", "devices")["devices"] if d["holder"]]) >= 4,
        60, "alice's kernel and servers to hold the four GPUs", interval=0.3,
        detail=lambda: first.log()[-4000:],
    )  # fmt: skip
    held = [d["holder"] for d in first.gateway("alice", "devices")["devices"]]
    assert (
        sorted((h["user"], h["kind"]) for h in held)
        == [("alice", "kernel")] + [("alice", "server")] * 3
    )
    resp = first.api("bob", "POST", "/users/bob/server", json={"tenant": "vision", "gpus": 1})
    assert resp.status_code == 202, resp.text
    queued = first.gateway("bob", "requests?user=bob&state=queued")
    assert len(queued) == 1

    procs = first.descendants()
    alice_pid = int(server["state"]["pid"]) if server.get("state") else None
    pids = {p.pid for p in procs}
    if alice_pid is not None:
        assert alice_pid in pids
    assert len(procs) >= 4  # the hub, the proxy, the gateway, alice's server
    ports = first.listening_ports()
    assert first.port in ports and len(ports) >= 5  # public, hub, proxy API, gateway, alice

    assert first.signal(signal.SIGTERM) == 0
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    busy = sorted(p for p in ports if not port_free(p))
    assert not busy, f"ports still bound after the demo stopped: {busy}"
    out = first.log()
    assert "stopped" in out
    # A normal start and a queued spawn log nothing alarming: no proxy 404 while the Hub
    # adds its route, no "slow to start" for bob, who waited in the GPU queue.
    assert not re.search(r"\[ConfigProxy\].*error", out), out[:6000]
    assert "slow to start" not in out and re.search(r"gpuaas request \S+ for bob: queued", out)
    # The servers went first, while the gateway could still take their GPUs back.
    released = re.search(r"gpuaas request \S+ of alice released", out)
    assert released, out[-4000:]
    services_stop = re.search(r"Cleaning up \d+ services", out)
    assert services_stop and released.start() < services_stop.start(), out[-4000:]

    # The same state again: the grant was released in the store, no phantom holder.
    again = demo("--devices", "simulated:a100=1x4", name="demo")  # same state directory
    again.port = free_port()
    again.url = f"http://127.0.0.1:{again.port}"
    again.tokens = dict(first.tokens)  # the Hub's database kept alice's token
    again.start()
    devices = again.gateway("alice", "devices")["devices"]
    assert [d for d in devices if d["holder"]] == []
    mine = again.gateway("alice", "requests?user=alice")
    assert {r["kind"] for r in mine} == {"server", "kernel"}
    assert "admitted" not in {r["state"] for r in mine}  # the kernel's grant went back too
    # bob's pending spawn was cancelled too: no queued request left for nobody to take.
    states = {r["state"] for r in again.gateway("bob", "requests?user=bob")}
    assert states and not states & {"queued", "admitted"}, states
    assert again.signal(signal.SIGTERM) == 0


def test_two_demos_side_by_side(demo) -> None:  # type: ignore[no-untyped-def]
    a = demo(name="a")  # --devices nvml, the default
    b = demo("--fast-idle", name="b")  # short idle times, to watch a cull cycle
    a.start()
    b.start()
    out = a.log()
    if "GPUs: simulated" in out:  # no GPU on this machine: one plain line, no NVML alarm
        assert "no GPU found: simulated GPUs" in out
        assert "NVML" not in out, out
    for run in (a, b):
        assert requests.get(f"{run.url}/hub/login", timeout=10).status_code == 200
        assert run.gateway("carol", "me")["name"] == "carol"
    assert not (a.listening_ports() & b.listening_ports())
    # b's gateway culls within minutes (warned half-way), a's after the shipped 30 min.
    idle = {
        name: {t["idle_timeout"] for t in run.gateway("carol", "tenants")["tenants"]}
        for name, run in (("a", a), ("b", b))
    }
    assert idle == {"a": {1800}, "b": {FAST_IDLE["idle_timeout"]}}, idle
    assert (b.state / "quotas-fast-idle.yaml").is_file()

    # A third one on a's state directory is refused, in one line, before it starts anything.
    third = subprocess.run(
        [str(DEMO), "demo", "--port", str(free_port()), "--state-dir", str(a.state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert third.returncode == 2
    assert third.stderr.strip().count("\n") == 0
    assert "used by another running demo" in third.stderr and str(a.state) in third.stderr

    assert a.signal(signal.SIGTERM) == 0
    # b is untouched by a's stop.
    assert requests.get(f"{b.url}/hub/login", timeout=10).status_code == 200
    assert b.signal(signal.SIGINT) == 0  # Ctrl-C stops it the same way
    assert port_free(a.port) and port_free(b.port)


def test_a_taken_port_is_named_in_one_line(tmp_path: Path) -> None:
    need_proxy()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run(
            [
                str(DEMO),
                "demo",
                "--port",
                str(port),
                "--state-dir",
                str(tmp_path / "state"),
                "--password",
                PASSWORD,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
