"""The spawn form and the GPU options of a queued spawn: which tenant, flavor and how many
GPUs, validated once for the form and the REST API alike (options.py), and the refusals
in words JupyterHub shows as they are. Split from spawner.py (`QueuedSpawnerMixin`
inherits it, so `c.QueuedSpawnerMixin.max_gpus` and the like still configure it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tornado import web
from traitlets import Dict, Integer, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from jupyter_gpuaas.client import GatewayClient, GatewayError

from .k8s import validate_flavors
from .options import (
    GpuOptions,
    OptionsError,
    options_from_form,
    parse_options,
    render_form,
    tenant_choices,
)

__all__ = ["SpawnFormMixin"]


class SpawnFormMixin(Configurable):
    """The GPU options of a spawn: traits, the spawn form, and their validation."""

    # Provided by QueuedSpawnerMixin and JupyterHub's Spawner.
    user: Any
    orm_spawner: Any
    user_options: dict[str, Any] | None
    if TYPE_CHECKING:

        def _reader_client(self) -> GatewayClient: ...

        async def _last_ending(self) -> str: ...

    flavors = Dict(
        help="""GPU flavors by name: {"a100": {"display_name": "NVIDIA A100 80GB",
        "resource": "nvidia.com/gpu", "node_selector": {...}, "tolerations": [...]}}.
        display_name labels the spawn form; the rest builds Kubernetes pods
        (QueuedKubeSpawner). Flavors the gateway knows but this lacks get plain names.""",
    ).tag(config=True)

    @validate("flavors")
    def _validate_flavors(self, proposal: Any) -> dict[str, Any]:
        try:
            return validate_flavors(proposal["value"])
        except ValueError as e:
            raise TraitError(str(e)) from None

    default_gpus = Integer(
        0,
        min=0,
        help="""GPUs a spawn asks for when its options name none (a REST start without a
        body, or a spawner without the form). 0 keeps scripted starts CPU-only.""",
    ).tag(config=True)

    max_gpus = Integer(
        8, min=0, help="The most GPUs one server may ask for (the form's maximum)."
    ).tag(config=True)

    simulated_banner = Unicode(
        "No GPU was found on this machine: the gateway grants SIMULATED devices. Queueing, "
        "quotas and culling are real; the CUDA_VISIBLE_DEVICES your server gets name no "
        "real GPU.",
        help="Shown on the spawn form when the gateway's devices are simulated.",
    ).tag(config=True)

    # ----------------------------------------------------------------- options

    @default("options_form")
    def _options_form_default(self) -> Any:
        return type(self)._gpuaas_options_form

    @default("options_from_form")
    def _options_from_form_default(self) -> Any:
        return _checked_options_from_form

    @default("apply_user_options")
    def _apply_user_options_default(self) -> Any:
        # tenant/flavor/gpus are this mixin's (gpu_options()); say so, or the Hub warns
        # that they went unhandled. A configured apply_user_options replaces this.
        return _gpu_options_are_ours

    def _member_groups(self) -> list[str]:
        return sorted(g.name for g in self.user.groups)

    async def _gpuaas_options_form(self) -> str:
        """The spawn form: the user's tenants with their usage, flavors, GPU count."""
        groups = self._member_groups()
        banner = error = ""
        tenants = []
        try:
            client = self._reader_client()
            data = await client.tenants()
            tenants = tenant_choices(data, groups)
            if data.get("simulated"):
                banner = self.simulated_banner
        except GatewayError as e:
            error = f"The GPU gateway cannot be reached ({e}); only a start with 0 GPUs works now."
        names = {n: str(s.get("display_name") or n) for n, s in self.flavors.items()}
        return render_form(
            tenants=tenants,
            flavor_names=names,
            default_gpus=self.default_gpus,
            max_gpus=self.max_gpus,
            last=self.orm_spawner.user_options or {},
            banner=banner,
            error=error,
            ended=await self._last_ending(),
        )

    def gpu_options(self, options: dict[str, Any] | None = None) -> GpuOptions:
        """This spawn's GPU options (or `options`), validated against the user's groups:
        the one validation of the form and the REST API, so both say the same words."""
        try:
            return parse_options(
                self.user_options or {} if options is None else options,
                default_gpus=self.default_gpus,
                max_gpus=self.max_gpus,
                member_of=self._member_groups(),
            )
        except OptionsError as e:
            raise _refused(e.status, str(e)) from None


def _gpu_options_are_ours(spawner: Any, user_options: dict[str, Any]) -> None:
    """apply_user_options: the GPU keys are read in wait_for_gpus(); nothing to apply."""


def _checked_options_from_form(formdata: dict[str, list[str]], spawner: Any) -> dict[str, Any]:
    """The form's options, refused at once (the form shows again, with the sentence) when
    `gpu_options()` would refuse them: the same validation as a REST API start."""
    options = options_from_form(formdata)
    spawner.gpu_options(options)
    return options


def _refused(status: int, sentence: str) -> web.HTTPError:
    """An HTTPError whose words JupyterHub shows as they are: its `jupyterhub_message` is
    what the spawn form and the Hub's REST API answer (not "HTTP 400: Bad Request (…)")."""
    error = web.HTTPError(status, "%s", sentence)
    error.jupyterhub_message = sentence  # type: ignore[attr-defined]
    return error


def _refusal(e: GatewayError) -> web.HTTPError:
    """A gateway refusal as the spawn's failure, in words the spawn page shows."""
    if e.status == 422:
        return _refused(422, f"this GPU request can never be admitted: {e}")
    if e.status in (401, 403):
        return _refused(403, f"the GPU gateway refused this request: {e}")
    if e.status == 400:
        return _refused(400, str(e))
    return _refused(503, f"the GPU gateway is unavailable: {e}")
