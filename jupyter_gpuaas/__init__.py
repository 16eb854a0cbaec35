"""jupyter-gpuaas: a notebook-centric GPU gateway for JupyterHub."""

from jupyter_gpuaas._version import __version__

__all__ = ["__version__", "load_ipython_extension"]


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    """The jupyter_server extension under its old name `jupyter_gpuaas` (INTERFACES.md).

    The packaged config enables it by its own module, `jupyter_gpuaas.server`; this alias
    keeps configs that name the package working (both lead to the same GpuaasExtension).
    Imported lazily: `import jupyter_gpuaas` must stay cheap for the CLI and the core.
    """
    if _enabled_by_module_name():
        # Both names enabled (the packaged config names the module, a user's config the
        # package): one GpuaasExtension, not two apps fighting over one server.
        return []
    from jupyter_gpuaas.server import _jupyter_server_extension_points as points

    return points()


def _enabled_by_module_name() -> bool:
    """Whether the server being configured also enables `jupyter_gpuaas.server`."""
    from jupyter_server.serverapp import ServerApp

    if not ServerApp.initialized():
        return False
    return bool(ServerApp.instance().jpserver_extensions.get("jupyter_gpuaas.server"))


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext jupyter_gpuaas`: the `%gpu` and `%%gpu_job` magics (imported only now)."""
    from jupyter_gpuaas.notebook.magics import load_ipython_extension as load

    load(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt JupyterLab extension `jupyter-gpuaas` (the "GPUs" sidebar), built from
    `labextension/` into `jupyter_gpuaas/labextension/` (what `jupyter labextension develop`
    links for an editable install; a wheel installs it under share/jupyter/labextensions)."""
    return [{"src": "labextension", "dest": "jupyter-gpuaas"}]
