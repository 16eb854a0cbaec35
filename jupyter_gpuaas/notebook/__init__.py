"""Notebook side: the `%gpu` and `%%gpu_job` magics and the ipywidgets that show jobs and
status live. The pure views they show are `jobs/views.py` (shared with the shell).

`%load_ext jupyter_gpuaas` (or `jupyter_gpuaas.notebook`) loads the magics; IPython is
imported only then, so importing this package costs nothing.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    from .magics import load_ipython_extension as load

    load(ipython)
