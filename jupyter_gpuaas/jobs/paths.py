"""Where a job may read and what may run it: a job's notebook, script or working
directory resolves inside the server's `root_dir` (as jupyter_server's contents API
resolves paths: relative to the root, symlinks followed), and its interpreter is this
server's, a kernelspec's, or one the administrator listed (`JobManager.interpreters`).

A path outside the root is a 403 that names the path as given and says nothing of what is
there (not even whether it exists); an interpreter outside the list is a 403 too.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from typing import Any

from .errors import JobError


def inside_root(root_dir: str, path: str, field: str) -> str:
    """`path` (relative to `root_dir`; an absolute path taken as it is, as the shell's
    `jupyter-gpuaas submit` sends one) resolved, symlinks followed; JobError 403 when
    it is outside `root_dir`."""
    if "\x00" in path:
        raise JobError(400, "must not contain NUL characters", field)
    root = os.path.realpath(root_dir)
    full = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, full]) != root:
        shown = path if len(path) <= 200 else path[:200] + "…"
        raise JobError(
            403,
            f"{shown!r} is outside the server's root directory: jobs run files inside it only",
            field,
        )
    return full


def interpreters(kernel_specs: Any, listed: Iterable[str], log: Any) -> set[str]:
    """This server's Python, each kernelspec's, and `listed` (JobManager.interpreters).

    `kernel_specs`: the server's KernelSpecManager (None: jupyter_client's default)."""
    allowed = {sys.executable, *listed}
    specs = kernel_specs
    if specs is None:
        from jupyter_client.kernelspec import KernelSpecManager

        specs = KernelSpecManager()
    try:
        found = specs.get_all_specs()
    except Exception as e:  # a broken kernel.json must not stop every job
        log.warning("gpuaas: cannot read the kernelspecs: %s", e)
        found = {}
    # jupyter_client runs these names as its own interpreter (sys.executable)
    python_names = {"python", f"python{sys.version_info[0]}",
                    "python{}.{}".format(*sys.version_info[:2])}  # fmt: skip
    for kernel in found.values():
        argv = (kernel.get("spec") or {}).get("argv") or []
        if not argv or not isinstance(argv[0], str) or argv[0] in python_names:
            continue
        where = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0])
        if where:
            allowed.add(where)
    return {os.path.abspath(a) for a in allowed if a}


def check_interpreter(python: str, allowed: set[str]) -> str:
    """A cell or script job's `python`: one of `allowed` (or another name of the same
    file, such as a venv's `python3` beside its `python`), else JobError 403."""
    if os.path.isabs(python) and (
        os.path.abspath(python) in allowed
        or os.path.realpath(python) in {os.path.realpath(a) for a in allowed}
    ):
        return python
    shown = python if len(python) <= 200 else python[:200] + "…"
    raise JobError(
        403,
        f"{shown!r} is not an interpreter of this server: use a kernel's Python, or ask "
        "the administrator to list it in JobManager.interpreters",
        "python",
    )
