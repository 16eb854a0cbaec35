"""Preemption with grace, as the user of a GPU kernel sees it (real gateway, real server).

A higher-priority request of the same team reclaims the only GPU (the admin turns on
`within_tenant: LowerPriority`; the quota file's policy has a 3 s `preemption_grace`):
the running kernel is warned first, in /gpuaas/kernels and /gpuaas/notifications (what
the sidebar shows in the notebook), keeps its GPU for the grace, and is then stopped,
"preempted", while the other request gets the GPU.

Not marked asyncio, like test_gpu_kernels.py (see its docstring): pytest-jupyter's loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from srvutil import TOKEN, GatewayProc
from test_gpu_kernels import _notes, gpu_kernel, kernel_ready, start_kernel, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.gateway_policy(preemption_grace=3)
async def test_running_kernel_is_warned_then_preempted(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    spec = {"quota": {"a100": 1}, "preemption": {"within_tenant": "LowerPriority"}}
    gateway.call("PUT", "api/tenants/vision", spec)
    kid = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, kid), 30, "the kernel")
    rec = await gpu_kernel(jp_fetch, kid)
    urgent = gateway.call(
        "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1, "priority": 5}, TOKEN
    )
    assert urgent["state"] == "queued"

    notes = await wait_for(lambda: _notes(jp_fetch, "preempt_warning"), 10, "the warning")
    warned = await gpu_kernel(jp_fetch, kid)
    message = warned["warning"]["message"]
    assert message.startswith("your kernel gpu1 will be stopped in ")
    assert message.endswith(": a higher-priority request of vision needs the GPU")
    assert notes[-1]["message"] == message and notes[-1]["kernel_id"] == kid
    # Within the grace it still holds its GPU, and still runs.
    held = gateway.request(rec["request_id"])
    assert held["state"] == "admitted" and held["preempted_by"] == urgent["id"]
    assert kid in gpu_app.kernel_manager
    assert gateway.request(urgent["id"])["estimated_wait"]["basis"].startswith(
        "taking 1 GPU from lower-priority work of vision, in "
    )

    await wait_for(lambda: kid not in gpu_app.kernel_manager, 20, "the preempted kernel stopped")
    ended = await gpu_kernel(jp_fetch, kid)
    # Said in words, never the preemptor's id (issue 45: every ending in words).
    assert ended["state"] == "preempted"
    assert ended["reason"] == "preempted: a higher-priority request of vision needed its GPU"
    assert gateway.request(rec["request_id"])["state"] == "preempted"
    assert gateway.request(urgent["id"])["state"] == "admitted"
