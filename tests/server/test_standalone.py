"""The provisioner without a server (nbclient, `jupyter console`): it finds the gateway from
the environment, and renews its own lease while the kernel holds its GPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_until
from srvutil import TOKEN, GatewayProc


@pytest.fixture
def standalone_env(
    gateway: GatewayProc, gpu_kernelspecs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.setenv("GPUAAS_URL", gateway.url)
    monkeypatch.setenv("GPUAAS_TOKEN", TOKEN)
    yield  # no extension: the provisioner makes its own table and client


async def test_standalone_kernel_renews_its_lease_and_releases_on_shutdown(
    standalone_env: None, gateway: GatewayProc
) -> None:
    from jupyter_client.manager import AsyncKernelManager
    from traitlets.config import Config

    config = Config({"GpuaasProvisioner": {"standalone_heartbeat": 0.5}})
    km = AsyncKernelManager(kernel_name="gpu1", config=config)
    await km.start_kernel()
    try:
        record: Any = km.provisioner.record
        assert record.devices == [0]
        first = gateway.request(record.request_id)["grant"]["lease_expires"]
        # Renewed by the provisioner itself.
        await wait_until(
            lambda: gateway.request(record.request_id)["grant"]["lease_expires"] > first,
            10, "the provisioner to renew its lease",
        )  # fmt: skip
    finally:
        await km.shutdown_kernel(now=True)
        km.context.destroy(linger=0)  # not left to a GC pass: see gpu_app in conftest.py
    assert gateway.request(record.request_id)["state"] == "finished"
