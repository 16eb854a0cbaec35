"""jupyter-gpuaas: a notebook-centric GPU gateway for JupyterHub."""

from jupyter_gpuaas._version import __version__

__all__ = ["__version__", "load_ipython_extension"]


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    """The jupyter_server extension `jupyter_gpuaas` (GPU kernels, proxy routes).

    Imported lazily: `import jupyter_gpuaas` must stay cheap for the CLI and the core.
    """
    from jupyter_gpuaas.server import _jupyter_server_extension_points as points

    return points()


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext jupyter_gpuaas`: the `%gpu` and `%%gpu_job` magics (imported only now)."""
    from jupyter_gpuaas.magics import load_ipython_extension as load

    load(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension `jupyter-gpuaas` (the "GPUs" sidebar), built from
    `labextension/` into `jupyter_gpuaas/labextension/` (what `jupyter labextension develop`
    links for an editable install; a wheel installs it under share/jupyter/labextensions)."""
    return [{"src": "labextension", "dest": "jupyter-gpuaas"}]
