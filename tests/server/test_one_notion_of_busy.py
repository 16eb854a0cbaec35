"""One notion of busy: jupyter_server's own kernel culler agrees with the gateway.

A real jupyter_server with its culler on (`MappingKernelManager.cull_idle_timeout`, as an
admin sets it) and a real gateway whose policy culls GPU kernels idle for 3 s. A GPU
kernel that trains in a background thread executes nothing and says nothing on iopub;
NVML (the project's fake NVML library, tests/nvmlfake.py, in place of a GPU) sees its
process at 90 %. The gateway counts it busy, and so must jupyter_server: the extension
moves the kernel's `last_activity` (and the server's) at each busy round. Once the GPU
goes quiet, the gateway warns and culls it, before jupyter_server's longer timeout.

As in test_gpu_kernels.py, the coroutine tests are run by pytest-jupyter on the server's
loop (no asyncio mark).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
from helpers import wait_until as wait_for
from srvutil import GatewayProc, gpu_extension, on_a_fake_gpu
from test_gpu_kernels import gpu_kernel, kernel_ready, start_kernel

pytestmark = pytest.mark.slow

#: jupyter_server's culler: kernels idle this many seconds are shut down (checked every 1 s).
CULL_IDLE_TIMEOUT = 10


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return {
        **jp_server_config,
        "MappingKernelManager": {"cull_idle_timeout": CULL_IDLE_TIMEOUT, "cull_interval": 1},
    }


def when(model: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(model["last_activity"].replace("Z", "+00:00"))


@pytest.mark.gateway_policy(idle_timeout=3, cull_warning=2, reservation_ttl=60)
async def test_a_gpu_kernel_busy_in_a_thread_is_kept_and_culled_by_the_gateway_once_idle(
    gpu_app: Any, jp_fetch: Callable[..., Awaitable[Any]], gateway: GatewayProc
) -> None:
    ext = gpu_extension(gpu_app)
    mkm = gpu_app.kernel_manager
    kid = await start_kernel(jp_fetch, "gpu1")
    await wait_for(kernel_ready(gpu_app, kid), 30, "the GPU kernel")
    record = ext.table.get(kid)
    pid, gpu = on_a_fake_gpu(ext, record)  # this host's device, by UUID
    gpu.process_utilization = {pid: 90}  # a training thread: iopub silent, GPU busy
    await wait_for(lambda: ext.current_activity(), 10, "the GPU use seen as activity")
    started = json.loads((await jp_fetch("api", "kernels", kid)).body)

    # The control: a CPU kernel started after the GPU kernel's last iopub message, idle
    # from then on. jupyter_server's culler shuts it down after CULL_IDLE_TIMEOUT...
    resp = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    cpu = json.loads(resp.body)["id"]
    await wait_for(lambda: cpu not in mkm, 4 * CULL_IDLE_TIMEOUT, "jupyter_server culling")
    # ...while the GPU kernel, quiet on iopub for longer still, is kept: its last
    # activity (the kernel model's and the server's) moves while the gateway counts it
    # busy, and the gateway heard it busy.
    assert kid in mkm
    model = json.loads((await jp_fetch("api", "kernels", kid)).body)
    assert when(model) > when(started)
    assert mkm.last_kernel_activity >= when(model)
    assert model["execution_state"] != "busy"  # executing nothing: busy on its GPU only
    assert gateway.request(record.request_id)["grant"]["busy"] is True

    # The GPU goes quiet: the gateway warns, then culls it (parked), before jupyter_server's
    # timeout, which would have shut the kernel down as `released`, not `culled`.
    gpu.process_utilization = {pid: 0}
    await wait_for(lambda: kid not in mkm, 4 * CULL_IDLE_TIMEOUT, "the idle kernel culled")
    culled = await gpu_kernel(jp_fetch, kid)
    assert culled["state"] == "culled", culled
    assert culled["reason"] == "culled: idle on GPU for 3 s"
    assert "will be shut down" in culled["warning"]["message"]
    assert gateway.request(record.request_id)["state"] == "parked"
