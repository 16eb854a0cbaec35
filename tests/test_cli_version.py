"""`jupyter-gpuaas --version` says which admission core runs: compiled with mypyc (a
platform wheel, `make core`) or pure Python (the compiled variant is checked from a built
wheel in tests/hub/test_demo_packaging.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import jupyter_gpuaas
import jupyter_gpuaas.admission.core as admission_core
from jupyter_gpuaas._version import __version__

PACKAGE = Path(jupyter_gpuaas.__file__).resolve().parent


def version(pythonpath: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    # Run from that directory: `-m` puts the working directory first on sys.path, and the
    # checkout's own package (compiled, after `make core`) would shadow PYTHONPATH's.
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpuaas.cli", "--version"],
        capture_output=True, text=True, env=env, timeout=60, cwd=pythonpath.split(os.pathsep)[0],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.slow
def test_the_version_says_which_core_runs(tmp_path: Path) -> None:
    compiled = not admission_core.__file__.endswith(".py")
    first, core = version(os.environ.get("PYTHONPATH", str(PACKAGE.parent)))
    assert first == f"jupyter-gpuaas {__version__}"
    assert core.startswith("admission core: compiled" if compiled else "admission core: pure")

    # The same package without any compiled module.
    shutil.copytree(PACKAGE, tmp_path / "jupyter_gpuaas",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "labextension"))  # fmt: skip
    assert version(str(tmp_path))[1] == (
        "admission core: pure Python, not compiled (slower, same decisions)"
    )
