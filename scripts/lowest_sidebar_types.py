"""Type-check the sidebar against the oldest JupyterLab its ranges admit (`make lowest`).

labextension/package.json asks for `@jupyterlab/application ^4.2.0` and the like, and the
package pins `jupyterlab>=4.2`; the build itself uses labextension/yarn.lock, whose
packages are the newest. Code that calls an API added after 4.2 would build, then fail in
a JupyterLab 4.2 in the field. So this script runs, with the interpreter of the
lowest-versions venv (whose JupyterLab is the oldest the pins allow):

  1. a scratch package in DEST with the sidebar's sources, its own `dependencies` and
     TypeScript, every `@jupyterlab/*` and `@lumino/*` package resolved as that
     JupyterLab's own release resolves them (`resolutions` of its staging/package.json:
     `~4.2.0` and so on, that release line's newest patch, since npm lacks some x.y.0);
  2. `jlpm install` of it (that JupyterLab's yarn, from npm), then `tsc --noEmit` with the
     sidebar's tsconfig.json.

Exit status 0 when it type-checks, 1 with tsc's errors otherwise. Usage:
    .venv-lowest/bin/python scripts/lowest_sidebar_types.py DEST
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jupyterlab  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
LABEXT = ROOT / "labextension"


def scratch_package(dest: Path) -> dict[str, str]:
    """Write the scratch package into `dest`; the resolutions it uses are returned."""
    staging = Path(jupyterlab.__file__).parent / "staging" / "package.json"
    lab_resolutions: dict[str, str] = json.loads(staging.read_text())["resolutions"]
    ours = json.loads((LABEXT / "package.json").read_text())
    resolutions = {
        name: spec
        for name, spec in lab_resolutions.items()
        if name.startswith(("@jupyterlab/", "@lumino/"))
    }
    package = {
        "name": "jupyter-gpuaas-lowest-types",
        "version": "0.0.0",
        "private": True,
        "dependencies": ours["dependencies"],
        "devDependencies": {"typescript": ours["devDependencies"]["typescript"]},
        "resolutions": resolutions,
    }
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in ("src", "style"):
        shutil.copytree(LABEXT / name, dest / name)
    for name in ("tsconfig.json", ".yarnrc.yml"):
        shutil.copy(LABEXT / name, dest / name)
    (dest / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    (dest / "yarn.lock").touch()  # its own project, not a workspace of the checkout's
    return resolutions


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0]).resolve()
    resolutions = scratch_package(dest)
    print(
        f"lowest-types: the sidebar against JupyterLab {jupyterlab.__version__}'s packages "
        f"(@jupyterlab/application {resolutions.get('@jupyterlab/application')}, "
        f"@jupyterlab/services {resolutions.get('@jupyterlab/services')})",
        flush=True,
    )
    jlpm = str(Path(sys.executable).with_name("jlpm"))
    # A new lockfile is this install's whole point, so yarn must be allowed to write one even
    # where it defaults to immutable installs (it does when $CI is set, as CI sets it).
    env = {**os.environ, "YARN_ENABLE_IMMUTABLE_INSTALLS": "false"}
    installed = subprocess.run([jlpm, "install"], cwd=dest, env=env, capture_output=True, text=True)
    if installed.returncode != 0:
        print(installed.stdout[-4000:], installed.stderr[-2000:], file=sys.stderr)
        return 1
    tsc = dest / "node_modules" / ".bin" / "tsc"
    checked = subprocess.run(
        [str(tsc), "--noEmit", "-p", "tsconfig.json"], cwd=dest, capture_output=True, text=True
    )
    if checked.returncode != 0:
        print(checked.stdout, checked.stderr, file=sys.stderr)
        return 1
    modules = dest / "node_modules" / "@jupyterlab"
    versions = {
        name: json.loads((modules / name / "package.json").read_text())["version"]
        for name in ("application", "services", "notebook")
    }
    print(f"lowest-types: it type-checks against {versions}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
