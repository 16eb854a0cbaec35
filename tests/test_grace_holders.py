"""Holders hear preemption with grace: the Hub spawner and the server extension.

Each gets the gateway's `preempt_warning` event for its own request (the shape the
gateway sends: decision fields and the victim's request object), logs a line, and keeps
the warning where its pages read it: "your server will be stopped in 5 min: nlp is
reclaiming its GPU". A `preempt_withdrawn` takes it back. The gateway side (persisted
before announced, eviction at the deadline, kill -9) is tested in tests/gateway/test_grace.py.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_gpuaas.admission.model import Request
from jupyter_gpuaas.gateway.grace import in_words, preempt_reason, reclaim_wait


def warning_event(rid: str, seconds: float, reason: str) -> dict[str, Any]:
    now = time.time()
    return {
        "t": now,
        "event": "preempt_warning",
        "id": rid,
        "by": "r-carol",
        "at": now + seconds,
        "request": {"id": rid, "state": "admitted", "preempt_reason": reason},
    }


def test_spawner_keeps_the_warning_until_withdrawn(caplog: pytest.LogCaptureFixture) -> None:
    from jupyter_gpuaas.hub import QueuedSimpleLocalProcessSpawner

    s = QueuedSimpleLocalProcessSpawner()
    s.user = SimpleNamespace(name="alice")
    s._gpu_claim = s._claim_of("r-alice")
    assert s.gpuaas_notice() is None
    with caplog.at_level(logging.INFO):
        s._preempt_notice(
            "preempt_warning", warning_event("r-alice", 300.5, "nlp is reclaiming its GPU")
        )
    notice = s.gpuaas_notice()
    assert notice == "your server will be stopped in 5 min: nlp is reclaiming its GPU"
    assert notice in caplog.text
    s._preempt_notice("preempt_withdrawn", {"id": "r-alice", "by": "r-carol"})
    assert s.gpuaas_notice() is None
    s._preempt_notice("preempt_warning", warning_event("r-alice", 60, "nlp is reclaiming its GPU"))
    s._gpu_claim = s._claim_of("r-next")  # a later request of the same spawner: not warned
    assert s.gpuaas_notice() is None


@pytest.mark.asyncio
async def test_server_extension_shows_it_in_gpuaas_kernels() -> None:
    from jupyter_gpuaas.server.extension import GpuaasExtension
    from jupyter_gpuaas.server.kernels import GpuKernel, KernelTable

    ext = GpuaasExtension()
    ext.table = KernelTable()
    record = ext.table.add(
        GpuKernel(
            "k-1", "python3-gpu", 1, "a100", tenant="vision", request_id="r-k", state="running"
        )
    )
    ext.table.add(GpuKernel("k-2", "python3-gpu", 1, "a100", request_id="r-other"))
    await ext.on_event("preempt_warning", warning_event("r-k", 299.6, "nlp is reclaiming its GPU"))
    shown = record.to_json()["warning"]
    assert (
        shown["message"]
        == "your kernel python3-gpu will be stopped in 5 min: nlp is reclaiming its GPU"
    )
    assert shown["preempt_at"] > time.time()
    assert [n.kind for n in ext.table.notifications] == ["preempt_warning"]
    assert ext.table.get("k-2").warning is None  # type: ignore[union-attr]
    await ext.on_event(
        "preempt_withdrawn", {"id": "r-k", "by": "r-carol", "request": {"id": "r-k"}}
    )
    assert record.to_json()["warning"] is None


@pytest.mark.asyncio
async def test_server_extension_tells_of_its_own_servers_eviction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU server's own request (GPUAAS_REQUEST_ID, set by the spawner) is warned too:
    the notice reaches /gpuaas/notifications, which the sidebar shows in the notebook."""
    from jupyter_gpuaas.server.extension import GpuaasExtension
    from jupyter_gpuaas.server.kernels import KernelTable

    monkeypatch.setenv("GPUAAS_REQUEST_ID", "r-server")
    ext = GpuaasExtension()
    ext.table = KernelTable()
    await ext.on_event("preempt_warning", warning_event("r-other", 60, "nlp is reclaiming its GPU"))
    assert not ext.table.notifications
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    ext.log.addHandler(handler)
    try:
        await ext.on_event(
            "preempt_warning", warning_event("r-server", 299.6, "nlp is reclaiming its GPU")
        )
    finally:
        ext.log.removeHandler(handler)
    (note,) = ext.table.notifications
    assert note.to_json()["message"] == (
        "your server will be stopped in 5 min: nlp is reclaiming its GPU"
    )
    assert note.request_id == "r-server" and any(note.message in line for line in logged)


def _req(rid: str, tenant: str, gpus: int, at: float | None = None) -> Request:
    r = Request(rid, tenant, "u", "kernel", gpus, 0.0)
    r.preempt_at = at
    return r


def test_the_preemptors_wait_in_words() -> None:
    carol = _req("r-c", "nlp", 1)
    assert reclaim_wait(carol, [], 0.0) is None
    wait = reclaim_wait(carol, [_req("r-a", "vision", 1, at=240.0)], 0.0)
    assert wait == {"seconds": 240.0, "basis": "reclaiming 1 GPU borrowed by vision, in 4 min"}
    two = reclaim_wait(carol, [_req("a", "vision", 2, 100.0), _req("b", "nlp", 1, 130.0)], 100.0)
    assert two is not None and two["seconds"] == 30.0
    assert two["basis"] == (
        "reclaiming 2 GPUs borrowed by vision and taking 1 GPU from lower-priority work"
        " of nlp, in 30 s"
    )
    assert in_words(0.2) == "in a moment" and in_words(7200) == "in 2 h"


def test_the_victims_reason_in_words() -> None:
    assert preempt_reason("vision", 1, "nlp") == "nlp is reclaiming its GPU"
    assert preempt_reason("vision", 2, "nlp") == "nlp is reclaiming its 2 GPUs"
    # Counted as the ending will be (words.gpus_taken): the preemptor's size.
    assert preempt_reason("vision", 4, "nlp", 1) == "nlp is reclaiming 1 of its 4 GPUs"
    assert preempt_reason("vision", 4, "nlp", 4) == "nlp is reclaiming its 4 GPUs"
    assert preempt_reason("vision", 4, "vision", 2) == (
        "a higher-priority request of vision needs 2 of the 4 GPUs"
    )
    assert (
        preempt_reason("vision", 1, "vision") == "a higher-priority request of vision needs the GPU"
    )
    assert preempt_reason("vision", 3, None) == "another request needs the 3 GPUs"
