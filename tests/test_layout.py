"""The house as a newcomer sees it from a shell: light commands stay light.

Run in a fresh interpreter each, so what another test imported does not count.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _imported_after(code: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUAAS_", "JUPYTERHUB_"))}
    probe = code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return set(out.stdout.splitlines()[-1].split())


def test_the_package_face_imports_neither_server_nor_notebook() -> None:
    mods = _imported_after("import jupyter_gpuaas")
    assert "jupyter_gpuaas._version" in mods
    above = ("jupyter_gpuaas.server", "jupyter_gpuaas.notebook")
    assert not {m for m in mods if m.startswith(above)}
    assert "jupyter_server" not in mods and "IPython" not in mods


@pytest.mark.parametrize("argv", [["jobs", "--help"], ["jobs"], ["logs", "some-id"]])
def test_a_jobs_command_in_a_shell_never_imports_ipywidgets(argv: list[str]) -> None:
    # `jobs` without a server to talk to ends in one line and exit 1; the views it would
    # print are imported on the way (jobs/views.py), the widgets never.
    mods = _imported_after(
        "from jupyter_gpuaas.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
    )
    assert "jupyter_gpuaas.jobs.cli" in mods
    assert "ipywidgets" not in mods and "IPython" not in mods
    assert not {m for m in mods if m.startswith("jupyter_gpuaas.notebook")}


def test_simulate_pays_for_no_service_at_start_up() -> None:
    # Every command registers every subcommand first: the gateway's Application (traitlets,
    # ssl, asyncio) is imported only when `gateway` runs.
    mods = _imported_after(
        "from jupyter_gpuaas.cli import main\n"
        "try:\n    main(['simulate', '--help'])\nexcept SystemExit:\n    pass\n"
    )
    assert "jupyter_gpuaas.sim.cli" in mods
    heavy = ("asyncio", "ssl", "traitlets", "tornado", "jupyter_gpuaas.gateway.app")
    assert not {m for m in mods if m.split(".")[0] in heavy or m in heavy}


def test_the_magics_still_load_by_the_package_name() -> None:
    mods = _imported_after(
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'jupyter_gpuaas')\n"
        "assert 'gpu' in ip.magics_manager.magics['line']\n"
        "assert 'gpu_job' in ip.magics_manager.magics['cell']\n"
    )
    assert "jupyter_gpuaas.notebook.magics" in mods


PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_gpuaas"


def _too_long(modules: list[Path], most: int) -> list[str]:
    lengths = {p: len(p.read_text().splitlines()) for p in modules}
    return [f"{p.relative_to(PACKAGE)}: {n} lines" for p, n in lengths.items() if n > most]


def test_every_module_reads_in_one_sitting() -> None:
    """Modules stay under 600 lines, and the admission core's under 400 (issue 15: each
    step of the cycle a small module)."""
    assert _too_long(sorted(PACKAGE.rglob("*.py")), 600) == []
    assert _too_long(sorted((PACKAGE / "admission").glob("*.py")), 400) == []
