"""NvmlInventory on a mixed host with MIG, against a fake NVML library (nvmlfake.py).

The host: 2× A100 (the second in MIG mode with two 1g.10gb instances) and a T4. Positions
restart at 0 per node, so only the UUIDs say which GPU of the host a device is.
"""

from __future__ import annotations

import argparse
import json
import sys

import pytest
from nvmlfake import FakeGpu, FakeMig, FakeNvml, mixed_host

from jupyter_gpuaas.client import launch_environment
from jupyter_gpuaas.devices import NvmlInventory, mig_flavor, parse_devices_spec
from jupyter_gpuaas.devices import cli as devices_cli

A100_0 = "GPU-a1000000-0000-0000-0000-000000000000"
A100_1 = "GPU-a1000001-0000-0000-0000-000000000001"
MIG_0 = "MIG-a1000001-0000-0000-0000-00000000m100"
MIG_3 = "MIG-a1000001-0000-0000-0000-00000000m103"
T4 = "GPU-74000002-0000-0000-0000-000000000002"


def test_positions_flavors_and_uuids_of_a_mixed_host_with_mig() -> None:
    inv = NvmlInventory(node="box", nvml=mixed_host())
    assert [(n.name, n.flavor, n.gpus) for n in inv.nodes()] == [
        ("box-a100", "a100", 1),
        ("box-a100-mig-1g-10gb", "a100-mig-1g.10gb", 2),
        ("box-t4", "t4", 1),
    ]
    assert [
        (d.node, d.index, d.flavor, d.uuid, d.mig_profile, d.parent_uuid) for d in inv.devices()
    ] == [
        ("box-a100", 0, "a100", A100_0, "", ""),
        ("box-a100-mig-1g-10gb", 0, "a100-mig-1g.10gb", MIG_0, "1g.10gb", A100_1),
        ("box-a100-mig-1g-10gb", 1, "a100-mig-1g.10gb", MIG_3, "1g.10gb", A100_1),
        ("box-t4", 0, "t4", T4, "", ""),
    ]
    # The GPU in MIG mode is not a device of its own: CUDA cannot run on it.
    assert A100_1 not in {d.uuid for d in inv.devices()}
    mig0, mig3 = (d for d in inv.devices() if d.mig_profile)
    # The second instance's name lacks the profile: it came from its attributes.
    assert mig0.model == mig3.model == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    assert mig0.memory_total == 9728 * 2**20
    assert inv.message == (
        "NVML: box-a100: 1× a100, box-a100-mig-1g-10gb: 2× a100-mig-1g.10gb, box-t4: 1× t4"
    )
    # What the gateway puts in a grant: position 0 of box-t4 is the T4, not NVML's GPU 0.
    assert inv.uuids("box-t4", [0]) == [T4]
    assert inv.uuids("box-a100-mig-1g-10gb", [1, 0]) == [MIG_3, MIG_0]
    assert inv.uuids("box-t4", [1]) is None  # no such device: no UUID to name
    inv.close()


def test_samples_of_mig_instances_are_healthy_without_utilization() -> None:
    inv = NvmlInventory(node="box", nvml=mixed_host())
    by_node = {(s.node, s.index): s for s in inv.sample()}
    t4 = by_node[("box-t4", 0)]
    assert (t4.utilization, t4.temperature, t4.power, t4.processes) == (
        0.8,
        42.0,
        102.0,
        {4242: 0.0},
    )
    mig = by_node[("box-a100-mig-1g-10gb", 1)]
    # NVML answers NotSupported for a MIG instance's utilization and sensors: not ill
    # health. Temperature is its board's; the board's power is not split among instances.
    assert mig.healthy and mig.error == ""
    assert (mig.utilization, mig.temperature, mig.power) == (0.0, 41.0, None)
    assert mig.memory_used == 9728 * 2**20 // 8
    inv.close()


def test_a_grant_on_the_t4_launches_with_the_t4_uuid() -> None:
    inv = NvmlInventory(node="box", nvml=mixed_host())
    grant = {
        "id": "r-1",
        "tenant": "vision",
        "grant": {
            "node": "box-t4",
            "flavor": "t4",
            "devices": [0],
            "uuids": inv.uuids("box-t4", [0]),
        },
    }
    env = launch_environment(grant)
    assert env["CUDA_VISIBLE_DEVICES"] == T4 != "0"
    assert env["NVIDIA_VISIBLE_DEVICES"] == T4
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (env["GPUAAS_NODE"], env["GPUAAS_FLAVOR"]) == ("box-t4", "t4")
    inv.close()


def test_single_model_host_is_one_node_named_after_the_host() -> None:
    fake = FakeNvml(
        [
            FakeGpu("Tesla T4", "GPU-t0", 15 * 2**30),
            FakeGpu("Tesla T4", "GPU-t1", 15 * 2**30),
        ]
    )
    inv = NvmlInventory(node="box", nvml=fake)
    assert [(n.name, n.flavor, n.gpus) for n in inv.nodes()] == [("box", "t4", 2)]
    assert [d.uuid for d in inv.devices()] == ["GPU-t0", "GPU-t1"]


def test_mig_mode_without_instances_grants_nothing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml([FakeGpu("NVIDIA H100 80GB HBM3", "GPU-h0", 80 * 2**30, True, True)])
    inv = NvmlInventory(node="box", nvml=fake)
    assert inv.devices() == [] and inv.message == "NVML: no devices"
    assert any("MIG mode with no MIG instances" in r.getMessage() for r in caplog.records)


def test_flavor_override_names_mig_flavors_after_it() -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                "NVIDIA A100-PCIE-40GB",
                "GPU-a",
                40 * 2**30,
                True,
                True,
                [FakeMig(0, "MIG-x", "3g.20gb", 20 * 2**30, slices=3)],
            )
        ]
    )
    inv = NvmlInventory(flavor="house", node="box", nvml=fake)
    assert [(n.name, n.flavor) for n in inv.nodes()] == [("box", "house-mig-3g.20gb")]


def test_spec_parser_builds_nvml_from_the_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--devices nvml` imports pynvml: the fake stands in for it in sys.modules."""
    fake = mixed_host()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inv = parse_devices_spec("nvml:node=box")
    assert len(inv.devices()) == 4
    inv.close()
    assert fake.shutdowns == 1


@pytest.mark.parametrize(
    ("profile", "flavor"),
    [
        ("1g.10gb", "a100-mig-1g.10gb"),
        ("7g.80gb", "a100-mig-7g.80gb"),
        ("1c.3g.40gb", "a100-mig-1c.3g.40gb"),
        ("1g.10gb+me", "a100-mig-1g.10gb-me"),
    ],
)
def test_mig_flavor(profile: str, flavor: str) -> None:
    assert mig_flavor("a100", profile) == flavor


def test_mig_flavor_refuses_what_is_not_a_profile() -> None:
    with pytest.raises(ValueError, match="bad MIG profile"):
        mig_flavor("a100", "MIG")


def test_devices_command_prints_uuids_and_mig_flavors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", mixed_host())
    parser = argparse.ArgumentParser()
    devices_cli.add_parser(parser.add_subparsers())
    assert devices_cli.run(parser.parse_args(["devices", "--devices", "nvml:node=box"])) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "NODE",
        "GPU",
        "FLAVOR",
        "MODEL",
        "UUID",
        "MEMORY",
        "UTIL",
        "TEMP",
        "POWER",
        "HEALTH",
    ]
    mig_row = next(line for line in table if MIG_3 in line)
    assert mig_row.startswith("box-a100-mig-1g-10gb  1    a100-mig-1g.10gb")
    assert any(line.startswith("box-t4") and T4 in line for line in table)

    args = parser.parse_args(["devices", "--json", "--devices", "nvml:node=box"])
    assert devices_cli.run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [
        (d["flavor"], d["uuid"], d["mig_profile"], d["parent_uuid"]) for d in doc["devices"]
    ] == [
        ("a100", A100_0, "", ""),
        ("a100-mig-1g.10gb", MIG_0, "1g.10gb", A100_1),
        ("a100-mig-1g.10gb", MIG_3, "1g.10gb", A100_1),
        ("t4", T4, "", ""),
    ]
