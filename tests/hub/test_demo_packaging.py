"""`pip install jupyter-gpuaas && jupyter-gpuaas demo` in an empty directory (issue 11 item 3,
issue 44 item 1): the package as an admin gets it.

The sdist is built from the checkout and the wheel from that sdist (`python -m build`, as
pip builds a wheel from PyPI's sdist), and the wheel is installed into a new, clean venv
(no system site-packages; uv, where the venv has it, fills the build environments and the
venv as pip would, in seconds rather than minutes, and pip checks the result). From that
venv, with no checkout beside it: the demo finds the JupyterHub config and the quota file
inside the package (importlib.resources), the admission core is the mypyc-compiled one
wherever this machine has a C compiler (the build hook, hatch_build.py), and JupyterLab and
jupyter_server see the sidebar and the server extension. configurable-http-proxy is on
PATH as a pip user has it (`npm install -g`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from demo_run import DemoRun
from hubutil import CHP, REPO, need_proxy

# A build (the sidebar is prebuilt in the checkout; mypyc compiles the core) and a venv
# install take minutes, more on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SHIPPED = (
    "jupyter_gpuaas/hub_config/local/jupyterhub_config.py",
    "jupyter_gpuaas/hub_config/local/quotas.yaml",
    "jupyter_gpuaas/hub_config/gpuaas_service_snippet.py",
    "jupyter_gpuaas/hub_config/gpuaas_kernels.py",
    "jupyter_gpuaas/hub_config/examples/two-teams.yaml",
)


def toolchain() -> str | None:
    """Why mypyc cannot compile here (then the wheel is pure Python), or None."""
    spec = importlib.util.spec_from_file_location("_build_core", REPO / "scripts" / "build_core.py")
    assert spec is not None and spec.loader is not None
    build_core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_core)
    missing: str | None = build_core.missing_toolchain()
    return missing


def clean_env(**extra: str) -> dict[str, str]:
    """This machine's environment without the test session's Python settings (PYTHONPATH
    would put the checkout before the installed package)."""
    drop = ("PYTHON", "VIRTUAL_ENV", "JUPYTER", "JPY_", "GPUAAS_", "PIP_REQUIRE")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


@dataclass
class Installed:
    sdist: Path
    wheel: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def run(self, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        path = f"{self.bin}{os.pathsep}/usr/bin:/bin"
        return subprocess.run(list(argv), cwd=cwd, env=clean_env(PATH=path), capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    def site_package(self) -> Path:
        [package] = self.venv.glob("lib/python3*/site-packages/jupyter_gpuaas")
        return package


def uv() -> str | None:
    """The venv's uv (the test extra has it), or None: then pip builds and installs."""
    exe = Path(sys.executable).with_name("uv")
    return str(exe) if exe.exists() else None


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    top = tmp_path_factory.mktemp("packaging")
    dist = top / "dist"
    # `python -m build DIR` builds the sdist, then the wheel from that sdist, each in an
    # isolated environment of the build requirements (JupyterLab among them). uv fills
    # those environments, when it is here, in seconds where pip takes minutes; what is
    # built is the same.
    installer = ["--installer", "uv"] if uv() else []
    built = subprocess.run(
        [sys.executable, "-m", "build", *installer, "--outdir", str(dist), str(REPO)],
        cwd=top, env=clean_env(), capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    [sdist] = dist.glob("*.tar.gz")
    [wheel] = dist.glob("*.whl")
    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean_env())
    # The wheel and the dependencies its metadata names, as `pip install` puts them in a
    # clean venv; uv does the same resolution and install in seconds, not minutes. The
    # venv's own pip then checks that every requirement is met.
    python = str(venv / "bin" / "python")
    if uv():
        argv = [str(uv()), "pip", "install", "--quiet", "--python", python, str(wheel)]
    else:
        argv = [python, "-m", "pip", "install", "--quiet", str(wheel)]
    pip = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=1200)
    assert pip.returncode == 0, pip.stderr[-4000:]
    check = subprocess.run(
        [python, "-m", "pip", "check"], env=clean_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout[-4000:]
    return Installed(sdist, wheel, venv)


def test_the_sdist_holds_hub_config_as_files_and_the_wheel_ships_it(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
    assert "hub_config/local/jupyterhub_config.py" in members
    assert not [name for name, m in members.items() if m.issym() or m.islnk()]
    assert "hatch_build.py" in members and "scripts/build_core.py" in members
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
    missing = [n for n in SHIPPED if n not in names]
    assert not missing, f"not in the wheel: {missing}"
    if toolchain() is None:  # a compiler here: a platform wheel with the compiled core
        assert not installed.wheel.name.endswith("-none-any.whl"), installed.wheel.name
        assert [n for n in names if n.startswith("jupyter_gpuaas/admission/core.")
                and n.endswith((".so", ".pyd"))], sorted(names)  # fmt: skip


def test_the_installed_commands_work_outside_a_checkout(
    installed: Installed, tmp_path: Path
) -> None:
    run = installed.run
    gpuaas = str(installed.bin / "jupyter-gpuaas")
    helped = run(gpuaas, "demo", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--quotas" in helped.stdout, helped
    code = "from jupyter_gpuaas.hub import demo; print(demo.CONFIG)"
    config = run(str(installed.bin / "python"), "-c", code, cwd=tmp_path)
    assert Path(config.stdout.strip()).is_file(), config
    assert Path(config.stdout.strip()).is_relative_to(installed.site_package())

    version = run(gpuaas, "--version", cwd=tmp_path)
    expected = "compiled with mypyc" if toolchain() is None else "pure Python"
    assert expected in version.stdout, (version, toolchain())

    # The shipped example, replayed by the installed (compiled) core, decides as the
    # checkout's own core does.
    example = installed.site_package() / "hub_config" / "examples" / "two-teams.yaml"
    simulated = run(gpuaas, "simulate", str(example), "--json", cwd=tmp_path)
    assert simulated.returncode == 0, simulated.stderr
    ours = subprocess.run(
        [sys.executable, "-m", "jupyter_gpuaas.cli", "simulate", str(example), "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    theirs, mine = json.loads(simulated.stdout), json.loads(ours.stdout)
    assert theirs.pop("wall_seconds") >= 0 and mine.pop("wall_seconds") >= 0
    assert theirs == mine

    labext = run(str(installed.bin / "jupyter"), "labextension", "list", cwd=tmp_path)
    listed = labext.stdout + labext.stderr
    [line] = [x for x in listed.splitlines() if "jupyter-gpuaas" in x]
    assert "enabled" in line and "OK" in line, listed  # the prebuilt sidebar, no rebuild
    serverext = run(str(installed.bin / "jupyter"), "server", "extension", "list", cwd=tmp_path)
    listed = re.sub(r"\x1b\[[0-9;]*m", "", serverext.stdout + serverext.stderr)  # colours
    lines = [x.split() for x in listed.splitlines()]
    assert ["jupyter_gpuaas.server", "enabled"] in lines, listed
    assert ["jupyter_gpuaas.server", "OK"] in lines, listed  # it imports and loads


def test_the_demo_runs_from_the_wheel_in_an_empty_directory(
    installed: Installed, tmp_path: Path
) -> None:
    need_proxy()
    path = f"{CHP.parent}{os.pathsep}{installed.bin}{os.pathsep}/usr/bin:/bin"
    run = DemoRun(
        tmp_path,
        "--devices",
        "simulated:a100=1x2",
        prefix=[str(installed.bin / "jupyter-gpuaas")],
        env={"PATH": path, "PYTHONPATH": ""},
    )
    try:
        run.start()
        assert requests.get(f"{run.url}/hub/login", timeout=10).status_code == 200
        devices = run.gateway("alice", "devices")["devices"]
        assert len(devices) == 2
        # The Hub ran the wheel's config, which read the wheel's quota file.
        assert str(installed.site_package() / "hub_config" / "local") in run.log()
        assert run.signal(signal.SIGTERM) == 0
    finally:
        run.kill_all()
