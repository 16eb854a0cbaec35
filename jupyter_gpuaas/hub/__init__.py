"""JupyterHub side of jupyter-gpuaas: spawners that queue GPU server starts.

Configure one of them as `c.JupyterHub.spawner_class`:

- `jupyter_gpuaas.hub.QueuedLocalProcessSpawner` (servers as system users),
- `jupyter_gpuaas.hub.QueuedSimpleLocalProcessSpawner` (no system users: demos, tests),
- `jupyter_gpuaas.hub.QueuedKubeSpawner` (needs `jupyterhub-kubespawner`),

or put `QueuedSpawnerMixin` in front of any other spawner class. spawner.py explains the
design (why the queue wait is not under `start_timeout`).

The classes are imported on first use: `jupyter-gpuaas demo` (hub/demo.py) must not pay
for JupyterHub's imports, and QueuedKubeSpawner exists only where kubespawner does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kube import QueuedKubeSpawner
    from .local import QueuedLocalProcessSpawner, QueuedSimpleLocalProcessSpawner
    from .spawner import QueuedSpawnerMixin

__all__ = [
    "QueuedKubeSpawner",
    "QueuedLocalProcessSpawner",
    "QueuedSimpleLocalProcessSpawner",
    "QueuedSpawnerMixin",
]

_WHERE = {
    "QueuedSpawnerMixin": ".spawner",
    "QueuedLocalProcessSpawner": ".local",
    "QueuedSimpleLocalProcessSpawner": ".local",
    "QueuedKubeSpawner": ".kube",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(where, __name__)
    except ImportError as e:
        if name == "QueuedKubeSpawner":
            raise ImportError(
                f"QueuedKubeSpawner needs KubeSpawner: pip install jupyterhub-kubespawner ({e})"
            ) from e
        raise
    return getattr(module, name)
