"""Grants name their devices by UUID, and `launch_environment` names those UUIDs.

A real gateway over real HTTP, its `--devices nvml` inventory reading a fake NVML library
(tests/nvmlfake.py, a test double standing in for pynvml) of a mixed host: 2× A100 (one
in MIG mode with two 1g.10gb instances) and a T4.
"""

from __future__ import annotations

import sys
from typing import Any

import jsonschema
import pytest
from gwutil import Gateway
from nvmlfake import mixed_host

from jupyter_gpuaas.client import launch_environment
from jupyter_gpuaas.gateway.openapi import build_openapi

A100_0 = "GPU-a1000000-0000-0000-0000-000000000000"
MIG_0 = "MIG-a1000001-0000-0000-0000-00000000m100"
MIG_3 = "MIG-a1000001-0000-0000-0000-00000000m103"
T4 = "GPU-74000002-0000-0000-0000-000000000002"

MIXED_QUOTAS: dict[str, Any] = {
    "flavors": {
        "a100": {"nodes": 1, "gpus_per_node": 1},
        "a100-mig-1g.10gb": {"nodes": 1, "gpus_per_node": 2},
        "t4": {"nodes": 1, "gpus_per_node": 1},
    },
    "tenants": {"vision": {"quota": {"a100": 1, "a100-mig-1g.10gb": 2, "t4": 1}}},
}


def check_request(value: Any) -> None:
    doc = build_openapi("/")
    jsonschema.validate(value, {"$ref": "#/components/schemas/Request", **doc})


@pytest.mark.asyncio
async def test_grants_on_a_mixed_host_carry_each_devices_uuid(
    make_gateway: Any, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", mixed_host())
    gw: Gateway = await make_gateway(sqlite_url, quotas=MIXED_QUOTAS, devices="nvml:node=box")
    alice = gw.client("alice")

    t4 = await alice.submit("vision", "kernel", 1, flavor="t4")
    check_request(t4)
    assert t4["state"] == "admitted"
    assert (t4["grant"]["node"], t4["grant"]["devices"]) == ("box-t4", [0])
    assert t4["grant"]["uuids"] == [T4]
    env = launch_environment(t4)
    # Position 0 of node box-t4, but NVML's (and CUDA's) device 0 is an A100.
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == T4
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (env["GPUAAS_REQUEST_ID"], env["GPUAAS_TENANT"]) == (t4["id"], "vision")
    assert (env["GPUAAS_FLAVOR"], env["GPUAAS_NODE"]) == ("t4", "box-t4")

    mig = await alice.submit("vision", "kernel", 2, flavor="a100-mig-1g.10gb")
    check_request(mig)
    assert mig["grant"]["uuids"] == [MIG_0, MIG_3]
    assert launch_environment(mig)["CUDA_VISIBLE_DEVICES"] == f"{MIG_0},{MIG_3}"

    whole = await alice.submit("vision", "job", 1, flavor="a100")
    assert launch_environment(whole)["CUDA_VISIBLE_DEVICES"] == A100_0

    # A listing and a fresh read say the same (the grant is built from the inventory).
    got = await alice.get(t4["id"])
    assert got["grant"]["uuids"] == [T4]

    devices = (await gw.raw("GET", "api/devices"))[1]["devices"]
    assert {d["uuid"] for d in devices} == {A100_0, MIG_0, MIG_3, T4}


@pytest.mark.asyncio
async def test_simulated_grants_have_no_uuids_and_launch_by_index(gw: Gateway) -> None:
    alice = gw.client("alice")
    req = await alice.submit("vision", "kernel", 2)
    check_request(req)
    assert req["grant"]["uuids"] is None
    env = launch_environment(req)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_launch_environment_without_a_grant_or_with_partial_uuids() -> None:
    assert launch_environment(None) == {}
    assert launch_environment({"id": "r-1", "state": "queued", "grant": None}) == {}
    partial = {"id": "r-1", "grant": {"node": "n", "devices": [0, 1], "uuids": ["GPU-x", ""]}}
    # One device without a UUID: the indices, never a half-named list.
    assert launch_environment(partial)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "GPUAAS_TENANT" not in launch_environment(partial)  # unknown: not set to ""
