"""`pip install jupyter-gpuaas && jupyter-gpuaas demo` in an empty directory (issue 11 item 3).

The wheel is built (hatchling, no build isolation: a second or two) and unpacked, not
installed into a new venv (too slow): its contents are imported first on PYTHONPATH, in
place of the checkout. The demo must find the JupyterHub config and the quota file inside
the package (importlib.resources), and configurable-http-proxy on PATH as a pip user has
it (`npm install -g`), with no checkout beside it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
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
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("jupyter_gpuaas-*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        missing = [n for n in SHIPPED if n not in names]
        assert not missing, f"not in the wheel: {missing}"
        z.extractall(site)
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
