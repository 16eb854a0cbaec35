"""Unit tests of the GPU-kernel pieces that need no server: the busy decision, the
kernelspec installer, the packaging of the extension's enable file."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jupyter_gpuaas.cli import main
from jupyter_gpuaas.server.activity import GpuUsage, Holder, decide_busy, process_tree
from jupyter_gpuaas.server.extension import human_duration
from jupyter_gpuaas.server.kernelspec_cli import default_display_name, default_name
from jupyter_gpuaas.words import format_duration

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("state", "last", "since", "util", "busy"),
    [
        ("busy", None, None, None, True),  # executing now
        ("idle", T0 + timedelta(seconds=5), T0, None, True),  # ran something since
        ("idle", T0 - timedelta(seconds=5), T0, None, False),  # nothing since
        ("idle", T0, None, None, False),  # first heartbeat, idle
        ("idle", None, T0, 0.50, True),  # background GPU work above the threshold
        ("idle", None, T0, 0.05, False),  # at the threshold is idle
        ("idle", None, T0, 0.0, False),  # process on the GPU, doing nothing
        ("starting", None, None, None, False),
    ],
)
def test_decide_busy(
    state: str, last: datetime | None, since: datetime | None, util: float | None, busy: bool
) -> None:
    assert decide_busy(state, last, since, util, threshold=0.05) is busy


def test_gpu_usage_without_nvml_reports_unknown() -> None:
    usage = GpuUsage()
    if usage.available:  # a GPU machine: the real path is covered by tests/gpu
        pytest.skip("NVML present")
    assert usage.utilization([Holder("k1", "n", [0], {1})]) == {"k1": None}
    assert usage.message


def test_process_tree_includes_the_process_itself() -> None:
    import os

    assert os.getpid() in process_tree(os.getpid())


def test_human_duration_is_the_one_formatter() -> None:
    assert human_duration is format_duration  # defined once, in jupyter_gpuaas/words.py
    assert human_duration(3) == "3 s" and human_duration(1800) == "30 min"


def test_kernelspec_install_writes_a_gpu_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["kernelspec", "install", "--gpus", "1", "--flavor", "a100", "--prefix", str(tmp_path)]
    )
    assert rc == 0
    spec_dir = tmp_path / "share" / "jupyter" / "kernels" / "python3-1gpu-a100"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpuaas",
        "config": {"gpus": 1, "flavor": "a100"},
    }
    assert spec["argv"][1:3] == ["-m", "ipykernel_launcher"]
    assert spec["display_name"] == "Python 3 (1 A100)"
    assert (spec_dir / "logo-64x64.png").exists()
    assert "Installed GPU kernelspec python3-1gpu-a100" in capsys.readouterr().out


def test_kernelspec_install_names_and_tenant(tmp_path: Path) -> None:
    rc = main(
        [
            "kernelspec",
            "install",
            "--gpus",
            "2",
            "--tenant",
            "vision",
            "--name",
            "gpu-two",
            "--display-name",
            "Python 3 (2 GPUs)",
            "--prefix",
            str(tmp_path),
        ]
    )
    assert rc == 0
    spec = json.loads(
        (tmp_path / "share" / "jupyter" / "kernels" / "gpu-two" / "kernel.json").read_text()
    )
    assert spec["display_name"] == "Python 3 (2 GPUs)"
    assert spec["metadata"]["kernel_provisioner"]["config"] == {"gpus": 2, "tenant": "vision"}


def test_kernelspec_install_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernelspec", "install", "--gpus", "0"]) == 2
    assert main(["kernelspec", "install", "--gpus", "1", "--name", "a b"]) == 2
    err = capsys.readouterr().err
    assert "--gpus must be at least 1" in err and "bad --name" in err


def test_default_names() -> None:
    assert default_name(1, None) == "python3-1gpu"
    assert default_display_name(1, None) == "Python 3 (1 GPU)"
    assert default_display_name(2, None) == "Python 3 (2 GPUs)"


def test_the_extension_is_enabled_by_a_packaged_config_file() -> None:
    data = json.loads(
        (ROOT / "jupyter-config" / "jupyter_server_config.d" / "jupyter_gpuaas.json").read_text()
    )
    # Enabled by its own module; the package face's old name still works (INTERFACES.md).
    assert data["ServerApp"]["jpserver_extensions"] == {"jupyter_gpuaas.server": True}
    # ...beside the kernel manager class GPU kernels need, which it names importably.
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
    from traitlets.utils.importstring import import_item

    manager = import_item(data["ServerApp"]["kernel_manager_class"])
    assert issubclass(manager, AsyncMappingKernelManager)
    assert manager.__name__ == "GpuaasKernelManager"
    import jupyter_gpuaas
    import jupyter_gpuaas.server

    assert jupyter_gpuaas._jupyter_server_extension_points() == (
        jupyter_gpuaas.server._jupyter_server_extension_points()
    )
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shared = project["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared["jupyter-config"] == "etc/jupyter"
    eps = project["project"]["entry-points"]["jupyter_client.kernel_provisioners"]
    assert eps["gpuaas"] == "jupyter_gpuaas.server.provisioner:GpuaasProvisioner"


def test_the_provisioner_is_found_by_jupyter_client() -> None:
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    names = {ep.name for ep in KernelProvisionerFactory.instance()._get_all_provisioners()}
    assert "gpuaas" in names


@pytest.mark.parametrize(
    "enabled",
    [
        {"jupyter_gpuaas.server": True},
        {"jupyter_gpuaas": True},
        {"jupyter_gpuaas.server": True, "jupyter_gpuaas": True},
        {"jupyter_gpuaas": True, "jupyter_gpuaas.server": True},
    ],
)
def test_either_name_or_both_give_one_extension(enabled: dict[str, bool]) -> None:
    # The packaged config enables `jupyter_gpuaas.server`; configs written for
    # INTERFACES.md name `jupyter_gpuaas`. Both at once must not make two apps (the second
    # would start without ever being initialized).
    from jupyter_server.extension.manager import ExtensionManager
    from jupyter_server.serverapp import ServerApp

    from jupyter_gpuaas.server.extension import GpuaasExtension

    ServerApp.clear_instance()
    app = ServerApp.instance(jpserver_extensions=enabled)
    try:
        manager = ExtensionManager(serverapp=app)
        manager.from_jpserver_extensions(enabled)
        apps = [a for apps in manager.extension_apps.values() for a in apps]
        assert [type(a) for a in apps] == [GpuaasExtension]
    finally:
        ServerApp.clear_instance()


def test_the_extension_attaches_to_its_kernel_manager_or_says_what_fails() -> None:
    import logging

    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from jupyter_gpuaas.server.extension import GpuaasExtension
    from jupyter_gpuaas.server.kernel_manager import GpuaasKernelManager

    ext = GpuaasExtension()
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    ext.log.addHandler(handler)
    try:
        ours = GpuaasKernelManager()
        ext._attach_kernel_manager(ours)
        assert ours.gpuaas is ext and records == []
        ours.close_context()
        ext._attach_kernel_manager(AsyncMappingKernelManager())
    finally:
        ext.log.removeHandler(handler)
    (said,) = [r.getMessage() for r in records]
    assert "AsyncMappingKernelManager, not jupyter_gpuaas.server.GpuaasKernelManager" in said
    assert "blocks the notebook until its GPUs are granted" in said
    assert (
        "Set ServerApp.kernel_manager_class = 'jupyter_gpuaas.server.GpuaasKernelManager'" in said
    )
