"""Local-process spawners that queue: the granted devices become CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from jupyter_gpuaas.claim import Grant
from jupyter_gpuaas.client import NO_DEVICES

from .spawner import QueuedSpawnerMixin


def device_env(grant: Grant | None, hide_without_grant: bool) -> dict[str, str]:
    """The environment that confines a local server to its granted devices.

    CUDA_VISIBLE_DEVICES is what CUDA (and so PyTorch, JAX, TensorFlow) obeys;
    NVIDIA_VISIBLE_DEVICES is what the NVIDIA container runtime reads when the "local"
    process is a container (docker run inside a wrapper script). Both name the granted
    devices (by UUID where the grant has them, see `Grant.environment`); without a grant
    both hide every device ("" and "void").
    """
    if grant is None:
        if not hide_without_grant:
            return {}
        return dict(NO_DEVICES)
    return grant.environment()


class _LocalGrantMixin(QueuedSpawnerMixin):
    _grant: Grant | None = None  # this start's grant (apply_grant)

    async def apply_grant(self, grant: Grant | None) -> None:
        self._grant = grant

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        env.update(device_env(self._grant, self.hide_devices_without_grant))
        return env


class QueuedLocalProcessSpawner(_LocalGrantMixin, LocalProcessSpawner):  # type: ignore[misc]
    """LocalProcessSpawner (servers run as the users' system accounts) behind the queue."""


class QueuedSimpleLocalProcessSpawner(_LocalGrantMixin, SimpleLocalProcessSpawner):  # type: ignore[misc]
    """SimpleLocalProcessSpawner (no system accounts; demos and tests) behind the queue."""
