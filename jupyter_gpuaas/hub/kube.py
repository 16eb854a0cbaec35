"""KubeSpawner behind the queue. Imported only when kubespawner is installed
(the `kubernetes` extra).

The pod is built on every start from two things only: what is configured (KubeSpawner's
traits, with the chosen profile's overrides) and this start's grant. KubeSpawner builds
the first (`get_pod_manifest()`); `jupyter_gpuaas.kubernetes.pods.grant_pod`, a pure
function, applies the second. Nothing of a grant is written into the spawner's traits, so
the next start — with another flavor, or with no GPU at all — sees none of it.

Profiles compose with the queue. The spawn form shows the queue's choices (tenant, GPU kind,
count) above KubeSpawner's profile list, and a profile may carry a `gpuaas` block that fixes
its GPUs, e.g. `{"display_name": "PyTorch, 2 A100", "gpuaas": {"gpus": 2, "flavor": "a100"},
"kubespawner_override": {"image": "pytorch/pytorch"}}`: choosing it asks the gateway for 2
a100 GPUs, the tenant still being the user's choice. A profile without the block leaves the
GPU count to the form (or the REST API's `gpus`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from tornado import web
from traitlets import Bool, Unicode, default

from jupyter_gpuaas.claim import Claim, Grant
from jupyter_gpuaas.kubeapi.workloads import DEFAULT_GRACE, QUEUE_LABEL
from jupyter_gpuaas.kubernetes.pods import HOSTNAME_LABEL, grant_pod, kueue_labels
from jupyter_gpuaas.kubernetes.prestop import prestop_lifecycle

from .options import GpuOptions, OptionsError, options_from_form, parse_options
from .spawner import QueuedSpawnerMixin


class _JSONBody:
    """What kubernetes_asyncio's ApiClient.deserialize() reads: a response's `.data`."""

    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj)


def profile_gpus(profile: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `gpuaas` block of a profile (its fixed `gpus` and `flavor`), checked."""
    profile = profile or {}
    block = profile.get("gpuaas") or {}
    if not isinstance(block, Mapping):
        raise ValueError(f"profile {profile.get('slug')!r}: gpuaas must be a mapping")
    unknown = sorted(set(block) - {"gpus", "flavor"})
    if unknown:
        raise ValueError(
            f"profile {profile.get('slug')!r}: unknown gpuaas key(s) {', '.join(unknown)}"
        )
    return dict(block)


class QueuedKubeSpawner(QueuedSpawnerMixin, KubeSpawner):  # type: ignore[misc]
    """KubeSpawner whose pods hold exactly the granted GPUs: the flavor's resource
    (`nvidia.com/gpu` or a MIG resource) as request and limit, its node selector and
    tolerations (`flavors` trait), pinned to the granted node; a gpus: 0 server gets no
    GPU resource and NVIDIA_VISIBLE_DEVICES=void."""

    pin_node_label = Unicode(
        HOSTNAME_LABEL,
        help="""Node label that pins a GPU pod, by required node affinity, to the node the
        gateway granted: the gateway's node names are the cluster's Node names when its
        inventory is `--devices kubernetes`. Empty: no pin, the scheduler picks any node of
        the flavor (for a gateway whose inventory is not the cluster's).""",
    ).tag(config=True)

    _grant: Grant | None = None  # this start's grant (apply_grant)
    _queued: dict[str, Any] | None = None  # Kueue mode: the request the pod waits for
    _pod_made: bool = False  # Kueue mode: this start's pod exists (before_gpu_wait)
    _profile_gpus: dict[str, Any] | None = None  # the chosen profile's `gpuaas` block
    kueue_queue = Unicode(
        "",
        help="""Kueue mode (the gateway's --admission kueue): the LocalQueue a GPU server's
        pod goes to, `{tenant}` replaced by the spawn's tenant (`jupyter-gpuaas kueue
        manifests` names each tenant's LocalQueue after it: `{tenant}`). Empty: no Kueue
        labels. A server without GPUs never goes to Kueue. The pod is then created as
        soon as the request is submitted, labelled with its LocalQueue and the request's
        id, and Kueue's pod integration holds it (scheduling gate) until Kueue admits it:
        that admission is the grant, and start() adopts the pod.""",
    ).tag(config=True)

    kueue_priority_class = Unicode(
        "",
        help="Kueue mode: the WorkloadPriorityClass of GPU server pods "
        "(`kueue.x-k8s.io/priority-class`). Empty: Kueue's default.",
    ).tag(config=True)

    prestop_hook = Bool(
        True,
        help="""Kueue mode: a GPU server pod's preStop hook (`python -m
        jupyter_gpuaas.kubernetes.prestop`) holds SIGTERM back while a preemption warning
        stands, so that the server runs (and the sidebar saves the open notebooks) until
        the time the user was told, not until the eviction. A preStop hook configured in
        `lifecycle_hooks` is kept instead. Off, or outside Kueue mode: no hook.""",
    ).tag(config=True)

    # ----------------------------------------------------------------- the pod

    async def apply_grant(self, grant: Grant | None) -> None:
        """The pod is built from the configuration and this start's grant (None: a pod
        that holds no GPU), on every start: see `get_pod_manifest`."""
        self._grant = grant
        self._queued = None
        if grant is None:  # no GPU: no pod of a queue to adopt
            self._pod_made = False

    async def before_gpu_wait(self, claim: Claim) -> None:
        """Kueue mode: the server's pod now, from the queued request (its GPUs, flavor
        and tenant; no node yet), gated by Kueue until it admits it. The wait that
        follows is the claim's, with the queue's progress on the spawn page."""
        self._pod_made = False
        if not self.kueue_queue:
            return
        self._grant, self._queued = None, dict(claim.request or {})
        pod = await self.get_pod_manifest()
        if self.modify_pod_hook:
            pod = await maybe_future(self.modify_pod_hook(self, pod))
        await self.api.create_namespaced_pod(self.namespace, pod)
        self._pod_made = True
        self.log.info(
            "gpuaas request %s of %s: pod %s created for Kueue's queue %s",
            claim.request_id,
            self._log_name,
            self.pod_name,
            pod.metadata.labels.get(QUEUE_LABEL),
        )

    async def stop(self, now: bool = False) -> None:
        if self.kueue_queue:
            # Kueue mode: the pod's end ends its Workload, and so the request, before
            # release_gpus gives it back: an end this stop made, not the gateway's.
            self._stopping_request = self._rid
        await super().stop(now=now)

    async def _make_create_pod_request(self, pod: Any, request_timeout: int) -> bool:
        """KubeSpawner's pod creation; in Kueue mode the pod made in the queue (and
        admitted since) is this start's: adopted, not made again."""
        if self._pod_made:
            self._pod_made = False
            return True
        made: bool = await super()._make_create_pod_request(pod, request_timeout)
        return made

    async def get_pod_manifest(self) -> Any:
        """KubeSpawner's pod from the configuration, then this start's grant on top."""
        pod = await super().get_pod_manifest()
        api = self.api.api_client
        built = grant_pod(
            api.sanitize_for_serialization(pod),
            request=self._queued if self._grant is None else self._grant.request,
            flavors=self.flavors,
            node_label=self.pin_node_label,
            hide_devices=self.hide_devices_without_grant,
        )
        grant = self._queued if self._grant is None else self._grant.request
        if self.kueue_queue and grant and int(grant.get("gpus") or 0) > 0:
            queue = self.kueue_queue.replace("{tenant}", str(grant.get("tenant") or ""))
            meta = built.setdefault("metadata", {})
            meta["labels"] = {
                **(meta.get("labels") or {}),
                **kueue_labels(
                    queue,
                    user=self.user.name,
                    kind="server",
                    priority_class=self.kueue_priority_class,
                    request=str(grant.get("id") or ""),
                ),
            }
            if self.prestop_hook:
                grace = built["spec"].get("terminationGracePeriodSeconds")
                hook = prestop_lifecycle(grace=DEFAULT_GRACE if grace is None else float(grace))
                for c in built["spec"]["containers"]:
                    if c.get("name") == "notebook":  # KubeSpawner's own container
                        c["lifecycle"] = {**hook, **(c.get("lifecycle") or {})}
        return api.deserialize(_JSONBody(built), "V1Pod")

    # ----------------------------------------------------------------- profiles

    @default("options_form")
    def _options_form_default(self) -> Any:
        return type(self)._composed_options_form

    async def _composed_options_form(self) -> str:
        ours = await self._gpuaas_options_form()
        profiles = await self._profiles()
        if not profiles:
            return ours
        return ours + "\n" + str(self._render_options_form(profiles))

    @default("options_from_form")
    def _options_from_form_default(self) -> Any:
        return self._composed_options_from_form

    def _composed_options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        options: dict[str, Any] = self._options_from_form(formdata) if self.profile_list else {}
        options.update(options_from_form(formdata))
        return options

    async def _profiles(self) -> list[dict[str, Any]]:
        profiles = self.profile_list
        if callable(profiles):
            profiles = await maybe_future(profiles(self))
        return list(self._sorted_dict_values(profiles) or [])

    async def _resolve_profile_gpus(self) -> None:
        """Read the chosen profile's `gpuaas` block before the queue (profile_list may be
        a coroutine, gpu_options() is not)."""
        fixed: dict[str, Any] = {}
        profiles = self._get_initialized_profile_list(await self._profiles())
        if profiles:
            try:
                fixed = profile_gpus(
                    self._get_profile((self.user_options or {}).get("profile"), profiles)
                )
            except ValueError as e:
                raise web.HTTPError(400, "GPU request refused: %s", str(e)) from None
        self._profile_gpus = fixed

    def gpu_options(self, options: dict[str, Any] | None = None) -> GpuOptions:
        """The GPU options (or `options`'), with the chosen profile's `gpuaas` block over
        the form's."""
        chosen = self.user_options or {} if options is None else options
        options = {**chosen, **(self._profile_gpus or {})}
        try:
            return parse_options(
                options,
                default_gpus=self.default_gpus,
                max_gpus=self.max_gpus,
                member_of=self._member_groups(),
            )
        except OptionsError as e:
            status = 403 if "not a member" in str(e) else 400
            raise web.HTTPError(status, "GPU request refused: %s", str(e)) from None

    async def wait_for_gpus(self) -> None:
        await self._resolve_profile_gpus()
        await super().wait_for_gpus()

    async def start(self) -> Any:
        if self._rid is None:
            await self._resolve_profile_gpus()
        return await super().start()
