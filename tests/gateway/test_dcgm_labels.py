"""Device series join NVIDIA dcgm-exporter's: its labels (`gpu`, `UUID`, `modelName`,
`Hostname`, `GPU_I_PROFILE`), and `gpuaas_grant_info` to charge its series to tenants."""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest
from gwutil import Gateway
from helpers import wait_until
from nvmlfake import mixed_host
from prometheus_client.parser import text_string_to_metric_families
from test_grant_uuids import MIXED_QUOTAS, T4
from test_metrics import scrape

from jupyter_gpuaas.devices import DeviceInfo, DeviceSample
from jupyter_gpuaas.gateway.metrics import GatewayMetrics, TenantUsage

GiB = 1024**3
WHOLE = DeviceInfo("gpu1", 0, "a100", "NVIDIA A100-SXM4-80GB", "GPU-aaaa", 80 * GiB)
MIG = DeviceInfo(
    "gpu1-a100-mig-1g", 0, "a100-mig-1g", "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
    "MIG-bbbb", 10 * GiB, mig_profile="1g.10gb", parent_uuid="GPU-cccc",
)  # fmt: skip
A100_1 = "GPU-a1000001-0000-0000-0000-000000000001"  # the MIG instances' GPU (nvmlfake)
SIMULATED = DeviceInfo("t4-0", 0, "t4", "Tesla T4 (simulated)", "", 15 * GiB)


def _metrics(user_label: bool) -> GatewayMetrics:
    m = GatewayMetrics(user_label=user_label, devices=lambda: [WHOLE, MIG, SIMULATED])
    m.set_snapshot(
        [TenantUsage("vision", "a100", 4, 1, 0, 0, 0)],
        [],
        {},
        {},
        [
            (DeviceSample("gpu1", 0, 0.5, 2 * GiB, 50.0, 100.0, True), "a100", "vision", "ann"),
            (
                DeviceSample("gpu1-a100-mig-1g", 0, 0.1, GiB, None, None, True),
                "a100-mig-1g",
                "nlp",
                "bo",
            ),
            (DeviceSample("t4-0", 0, 0.0, 0, 32.0, 10.0, True), "t4", "vision", "ann"),
        ],
    )
    return m


def _rows(
    series: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> list[dict[str, str]]:
    return [dict(labels) for n, labels in series if n == name]


def test_device_series_carry_dcgm_exporter_labels() -> None:
    s = scrape(_metrics(user_label=False))
    util = {r["node"]: r for r in _rows(s, "gpuaas_device_utilization_ratio")}
    host = socket.gethostname()
    assert util["gpu1"] == {
        "node": "gpu1", "device": "0", "flavor": "a100", "tenant": "vision", "user": "",
        "gpu": "", "UUID": "GPU-aaaa", "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": host, "GPU_I_PROFILE": "",
    }  # fmt: skip
    # A MIG instance: its GPU's UUID and its profile, as dcgm-exporter labels it.
    mig = util["gpu1-a100-mig-1g"]
    assert (mig["UUID"], mig["GPU_I_PROFILE"], mig["Hostname"]) == ("GPU-cccc", "1g.10gb", host)
    # Positions restart per node here (two nodes on one host): no `gpu` that could be wrong.
    assert (util["gpu1"]["gpu"], mig["gpu"]) == ("", "")
    # Simulated: nothing real to name; the node stands for the host.
    sim = util["t4-0"]
    assert (sim["UUID"], sim["Hostname"], sim["modelName"]) == ("", "t4-0", "Tesla T4 (simulated)")
    # Every device series has the same labels, so dashboards can divide one by another.
    for name in ("gpuaas_device_memory_used_bytes", "gpuaas_device_memory_total_bytes"):
        assert {r["node"]: r for r in _rows(s, name)} == util, name
    totals = {
        dict(ls)["node"]: v for (n, ls), v in s.items() if n == "gpuaas_device_memory_total_bytes"
    }
    assert totals == {"gpu1": 80 * GiB, "gpu1-a100-mig-1g": 10 * GiB, "t4-0": 15 * GiB}


def test_gpu_is_nvmls_index_on_a_host_of_whole_gpus_of_one_model() -> None:
    second = DeviceInfo("gpu1", 1, "a100", "NVIDIA A100-SXM4-80GB", "GPU-dddd", 80 * GiB)
    m = GatewayMetrics(devices=lambda: [WHOLE, second])
    rows = [(DeviceSample("gpu1", i, 0.0, 0, 30.0, 50.0, True), "a100", None, None) for i in (0, 1)]
    m.set_snapshot([], [], {}, {}, rows)
    util = _rows(scrape(m), "gpuaas_device_utilization_ratio")
    assert {(r["gpu"], r["UUID"]) for r in util} == {("0", "GPU-aaaa"), ("1", "GPU-dddd")}


def test_grant_info_charges_devices_with_a_uuid_to_tenants() -> None:
    host = socket.gethostname()
    hidden = _rows(scrape(_metrics(user_label=False)), "gpuaas_grant_info")
    assert sorted(hidden, key=lambda r: r["UUID"]) == [
        {"UUID": "GPU-aaaa", "GPU_I_PROFILE": "", "Hostname": host, "tenant": "vision",
         "user": "", "flavor": "a100"},
        {"UUID": "GPU-cccc", "GPU_I_PROFILE": "1g.10gb", "Hostname": host, "tenant": "nlp",
         "user": "", "flavor": "a100-mig-1g"},
    ]  # fmt: skip
    named = _rows(scrape(_metrics(user_label=True)), "gpuaas_grant_info")
    assert {r["UUID"]: r["user"] for r in named} == {"GPU-aaaa": "ann", "GPU-cccc": "bo"}


def test_free_devices_and_standbys_have_no_grant_info() -> None:
    m = GatewayMetrics(devices=lambda: [WHOLE])
    free = (DeviceSample("gpu1", 0, 0.0, 0, 30.0, 50.0, True), "a100", None, None)
    m.set_snapshot([], [], {}, {}, [free])
    assert not _rows(scrape(m), "gpuaas_grant_info")
    held = (DeviceSample("gpu1", 0, 0.0, 0, 30.0, 50.0, True), "a100", "vision", "ann")
    m.set_snapshot([], [], {}, {}, [held], leader=False)
    assert not _rows(scrape(m), "gpuaas_grant_info")
    m.set_snapshot([], [], {}, {}, [held])
    assert _rows(scrape(m), "gpuaas_grant_info")


def test_lease_expiries_are_counted_per_tenant_and_kind() -> None:
    m = GatewayMetrics()
    m.inc_lease_expired("vision", "kernel")
    m.inc_lease_expired("vision", "kernel")
    s = scrape(m)
    assert s[("gpuaas_lease_expired_total", (("kind", "kernel"), ("tenant", "vision")))] == 2


@pytest.mark.asyncio
async def test_a_real_gateway_on_nvml_charges_uuids_to_tenants(
    make_gateway: Any, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real gateway over HTTP, its NVML inventory reading tests/nvmlfake.py (a test double
    standing in for pynvml: no GPU here) of a mixed host: A100, A100 in MIG mode, T4."""
    monkeypatch.setitem(sys.modules, "pynvml", mixed_host())
    gw: Gateway = await make_gateway(
        sqlite_url, quotas=MIXED_QUOTAS, devices="nvml:node=box", metrics_public=True
    )
    alice = gw.client("alice")
    t4 = await alice.submit("vision", "kernel", 1, flavor="t4")
    mig = await alice.submit("vision", "kernel", 1, flavor="a100-mig-1g.10gb")
    assert t4["state"] == mig["state"] == "admitted"

    async def grants() -> list[dict[str, str]]:
        status, text = await gw.raw("GET", "metrics", who=None)
        assert status == 200, text
        families = text_string_to_metric_families(text)
        return [
            dict(s.labels) for f in families for s in f.samples if s.name == "gpuaas_grant_info"
        ]

    async def both() -> list[dict[str, str]] | None:
        found = await grants()
        return found if len(found) >= 2 else None

    found = await wait_until(both, 10, "the first device sample", interval=0.2)
    host = socket.gethostname()
    assert sorted(found, key=lambda r: r["flavor"]) == [
        {"UUID": A100_1, "GPU_I_PROFILE": "1g.10gb", "Hostname": host, "tenant": "vision",
         "user": "", "flavor": "a100-mig-1g.10gb"},
        {"UUID": T4, "GPU_I_PROFILE": "", "Hostname": host, "tenant": "vision", "user": "",
         "flavor": "t4"},
    ]  # fmt: skip
