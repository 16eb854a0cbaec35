"""Unit tests of the activity pieces that need no server: which comm traffic is ours, how
NVML holders are found by UUID on a mixed host, the jobs' activity hook, the status
widget's refresh period and the spawner's lease renewal when the server speaks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from jupyter_client.session import Session
from nvmlfake import mixed_host

from jupyter_gpuaas.devices import NvmlInventory
from jupyter_gpuaas.jobs import model
from jupyter_gpuaas.jobs.manager import JobManager
from jupyter_gpuaas.jobs.server_client import ServerClient
from jupyter_gpuaas.jobs.views import WIDGET_CLASS
from jupyter_gpuaas.notebook.magics import line_parser
from jupyter_gpuaas.server.activity import GpuUsage, Holder, OwnComms, visible_uuids


def _wire(session: Session, msg_type: str, content: dict[str, Any]) -> list[bytes]:
    msg = session.msg(msg_type, content)
    return [bytes(part) for part in session.serialize(msg)]


def test_only_our_widgets_comm_traffic_is_dropped() -> None:
    session = Session(key=b"k")
    comms = OwnComms()
    seen: list[str] = []
    watcher = comms.wrap(Session(key=b"k"), lambda parts: seen.append("x"))
    ours = {"comm_id": "c1", "target_name": "jupyter.widget",
            "data": {"state": {"_dom_classes": [WIDGET_CLASS]}}}  # fmt: skip
    theirs = {"comm_id": "c2", "target_name": "jupyter.widget",
              "data": {"state": {"_dom_classes": []}}}  # fmt: skip
    watcher(_wire(session, "comm_open", ours))
    watcher(_wire(session, "comm_open", theirs))
    assert comms.comm_ids == {"c1"} and seen == ["x"]  # another widget's open passes
    update = {"method": "update", "state": {"value": "new"}}
    watcher(_wire(session, "comm_msg", {"comm_id": "c1", "data": update}))
    assert seen == ["x"]  # our refresh: not activity
    watcher(_wire(session, "comm_msg", {"comm_id": "c2", "data": update}))
    watcher(_wire(session, "status", {"execution_state": "busy"}))
    watcher(_wire(session, "stream", {"name": "stdout", "text": "hi"}))
    assert seen == ["x"] * 4  # everything else reaches jupyter_server's watcher
    watcher(_wire(session, "comm_close", {"comm_id": "c1", "data": {}}))
    assert comms.comm_ids == set() and comms.dropped == 3
    watcher([b"garbage"])  # unreadable: jupyter_server's to judge
    assert seen == ["x"] * 5


def test_a_kernel_manager_without_an_activity_stream_is_left_alone() -> None:
    assert OwnComms().watch(SimpleNamespace()) is False


def test_gpu_usage_finds_a_holder_by_uuid_on_a_mixed_host() -> None:
    """On a mixed host (A100s and a T4: one node per model), the T4 is index 0 of its
    node; the grant's UUID names it, and the kernel's PID on it is its utilization."""
    fake = mixed_host()
    t4 = fake.gpus[2]
    t4.process_utilization = {4242: 70}
    usage = GpuUsage()
    usage._tried, usage._inventory = True, NvmlInventory(nvml=fake, node="h")
    by_uuid = Holder("k1", "gateway-node", [0], {4242}, [t4.uuid])
    a100 = Holder("k2", "gateway-node", [0], {4242}, [fake.gpus[0].uuid])
    nowhere = Holder("k3", "gateway-node", [0], {1}, ["GPU-not-on-this-host"])
    out = usage.utilization([by_uuid, a100, nowhere])
    assert out["k1"] == 0.7  # its PID on the T4, found by UUID
    assert out["k2"] == 0.0  # the same index, another model: its PID is not there
    assert out["k3"] is None  # no device of this host: NVML cannot say
    usage.close()


def test_visible_uuids_reads_only_uuids() -> None:
    assert visible_uuids({"CUDA_VISIBLE_DEVICES": "GPU-a, MIG-b"}) == ["GPU-a", "MIG-b"]
    assert visible_uuids({"CUDA_VISIBLE_DEVICES": "0,1"}) == []
    assert visible_uuids({}) == []


def test_jobs_activity_hook(tmp_path: Path) -> None:
    manager = JobManager(None, str(tmp_path), state_dir=str(tmp_path / "state"))
    now = time.time()

    def job(jid: str, state: str, **kw: Any) -> model.Job:
        j = model.Job(id=jid, kind="cell", tenant="vision", gpus=1, state=state,
                      outdir=str(tmp_path / jid), cwd=str(tmp_path), **kw)  # fmt: skip
        manager.jobs[jid] = j
        return j

    job("q", model.QUEUED)
    assert manager.activity() == []  # waiting is not work
    job("r", model.RUNNING, started=now)
    job("done", model.SUCCEEDED, started=now - 10, ended=now - 1)
    job("old", model.FAILED, started=now - 100, ended=now - 90)
    assert manager.activity(now - 5)[0] == "job r is running"
    assert [a.split(" ran")[0] for a in manager.activity(now - 5)[1:]] == ["job done"]


def test_status_refresh_period_is_checked() -> None:
    args = line_parser().parse_args(["status", "--every", "0.5"])
    assert args.every == 0.5 and line_parser().parse_args(["status"]).every == 5.0
    from IPython.core.error import UsageError

    for bad in ("0", "nan", "soon", "7200"):
        with pytest.raises(UsageError, match="every"):
            line_parser().parse_args(["status", "--every", bad])


def test_a_quiet_client_says_no_track_activity() -> None:
    client = ServerClient("http://127.0.0.1:1/", "t")
    assert "no_track_activity" not in client._request("GET", "gpuaas/jobs").full_url
    assert (
        client.quiet()
        ._request("GET", "gpuaas/jobs")
        .full_url.endswith("gpuaas/jobs?no_track_activity=1")
    )


class _Gateway:
    def __init__(self, expires: float) -> None:
        self.expires = expires
        self.beats: list[bool] = []

    async def get(self, rid: str) -> dict[str, Any]:
        return {"id": rid, "state": "admitted", "grant": {"lease_expires": self.expires}}

    async def heartbeat(self, rid: str, busy: bool) -> dict[str, Any]:
        self.beats.append(busy)
        self.expires = time.time() + 100
        return {}


@pytest.mark.asyncio
async def test_the_spawner_renews_only_a_lease_nobody_else_renews() -> None:
    from jupyter_gpuaas.hub import QueuedSimpleLocalProcessSpawner

    s = QueuedSimpleLocalProcessSpawner()
    s.heartbeat_interval = 0.05
    s._gpu_claim, s._server_running = s._claim_of("r-1"), True
    s.orm_spawner = None  # no Hub here: no HTTP activity, idle by the Hub's view
    fresh = _Gateway(time.time() + 100)  # the server renews it (its own heartbeats)
    s._user_client = lambda: fresh  # type: ignore[method-assign]
    task = asyncio.ensure_future(s._heartbeat_loop())
    await asyncio.sleep(0.3)
    assert fresh.beats == []  # the server speaks: the spawner says nothing over it
    stale = _Gateway(time.time() + 0.05)  # nobody renews: an image without the extension
    s._user_client = lambda: stale  # type: ignore[method-assign]
    await asyncio.sleep(0.3)
    assert stale.beats[:1] == [False]  # renewed, with the Hub's view (no activity: idle)
    s._gpu_claim = None
    await asyncio.wait_for(task, 2)
