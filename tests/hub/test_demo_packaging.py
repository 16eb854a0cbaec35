"""`pip install jupyter-gpuaas && jupyter-gpuaas demo` in an empty directory (issue 11 item 3).

The wheel's files (hatchling's selection for it) are laid out in a directory, not built
and installed into a new venv (too slow): they are imported first on PYTHONPATH, in place
of the checkout. The demo must find the JupyterHub config and the quota file inside
the package (importlib.resources), and configurable-http-proxy on PATH as a pip user has
it (`npm install -g`), with no checkout beside it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from demo_run import CHP, REPO, DemoRun, need_proxy

pytestmark = pytest.mark.slow

SHIPPED = (
    "jupyter_gpuaas/hub_config/local/jupyterhub_config.py",
    "jupyter_gpuaas/hub_config/local/quotas.yaml",
    "jupyter_gpuaas/hub_config/gpuaas_service_snippet.py",
    "jupyter_gpuaas/hub_config/gpuaas_kernels.py",
    "jupyter_gpuaas/hub_config/examples/two-teams.yaml",
)


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's files, laid out as pip would install them: hatchling's own selection
    for the wheel (`packages`, the hub_config link followed), without its build hooks
    (the sidebar's JupyterLab build) or the zip."""
    wheel = pytest.importorskip("hatchling.builders.wheel")
    site = tmp_path_factory.mktemp("wheel") / "site"
    names = set()
    for f in wheel.WheelBuilder(str(REPO)).recurse_included_files():
        target = site / f.distribution_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f.path, target)
        names.add(f.distribution_path)
    missing = [n for n in SHIPPED if n not in names]
    assert not missing, f"not in the wheel: {missing}"
    return site


def test_the_wheel_ships_the_config_and_the_demo_finds_it(unpacked: Path, tmp_path: Path) -> None:
    code = "from jupyter_gpuaas.hub import demo; print(demo.CONFIG)"
    env = {**os.environ, "PYTHONPATH": str(unpacked)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    config = Path(done.stdout.strip())
    assert config.is_file()
    assert config.is_relative_to(unpacked), config  # the package's, not the checkout's


def test_the_demo_runs_from_the_wheel_in_an_empty_directory(unpacked: Path, tmp_path: Path) -> None:
    need_proxy()
    path = f"{CHP.parent}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin"
    run = DemoRun(
        tmp_path,
        "--devices",
        "simulated:a100=1x2",
        prefix=[sys.executable, "-m", "jupyter_gpuaas.cli"],
        env={"PYTHONPATH": str(unpacked), "PATH": path},
    )
    try:
        run.start()
        assert requests.get(f"{run.url}/hub/login", timeout=10).status_code == 200
        devices = run.gateway("alice", "devices")["devices"]
        assert len(devices) == 2
        # The Hub ran the wheel's config, which read the wheel's quota file.
        assert str(unpacked / "jupyter_gpuaas" / "hub_config" / "local") in run.log()
        assert run.signal(signal.SIGTERM) == 0
    finally:
        run.kill_all()
