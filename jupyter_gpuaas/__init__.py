"""jupyter-gpuaas: a notebook-centric GPU gateway for JupyterHub."""

__version__ = "0.1.0"
