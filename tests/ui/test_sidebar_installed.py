"""The prebuilt sidebar as this environment's JupyterLab finds it (issue 44, item 2).

Run by `make test` twice: in the project's venv, and in the lowest-versions venv of
`make lowest` (LOWEST_SMOKE in the Makefile), where JupyterLab is the oldest release the
pins allow. `jupyter labextension list` of this environment must list jupyter-gpuaas,
installed in this environment (not a user's or another checkout's copy), enabled, and "OK":
JupyterLab's own check that every singleton package the sidebar shares (its
`@jupyterlab/*` and `@lumino/*` dependency ranges in labextension/package.json) overlaps
the version this JupyterLab ships. tests/ui/test_lab_in_hub.py, in the same smoke set,
then opens the panel in that JupyterLab in Chromium.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_prebuilt_sidebar_is_installed_enabled_and_compatible_with_this_jupyterlab() -> None:
    import jupyterlab

    if not (ROOT / "jupyter_gpuaas" / "labextension" / "package.json").exists():
        pytest.skip("the sidebar is not built: `make labextension` (make test does)")
    version = json.loads((ROOT / "labextension" / "package.json").read_text())["version"]
    jupyter = Path(sys.executable).with_name("jupyter")
    done = subprocess.run(
        [str(jupyter), "labextension", "list"], capture_output=True, text=True, timeout=120
    )
    listed = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)  # colours
    assert done.returncode == 0, listed
    assert f"JupyterLab v{jupyterlab.__version__}" in listed, listed
    # The directory each extension is listed under, and its line.
    where, line = "", ""
    for text in listed.splitlines():
        if text and not text[0].isspace():
            here = text.strip()
        elif text.split()[:1] == ["jupyter-gpuaas"]:
            where, line = here, text
    assert line, f"jupyter-gpuaas is not listed by JupyterLab {jupyterlab.__version__}:\n{listed}"
    # This environment's own share/jupyter (pip's shared-data), as a user's install has it.
    assert Path(where) == Path(sys.prefix) / "share" / "jupyter" / "labextensions", listed
    assert line.split()[:4] == ["jupyter-gpuaas", f"v{version}", "enabled", "OK"], listed
    assert "incompatible" not in listed and "outdated" not in listed, listed
