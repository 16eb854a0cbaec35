"""Scale-up: turning the core's node demand into more (or fewer) GPU nodes.

The admission core decides how many nodes of each flavor the queue needs: ready nodes plus
what quota-admissible, capacity-blocked requests would fill (SCENARIO.md, "Autoscale").
The gateway exports that as `gpuaas_desired_nodes{flavor}` and calls the configured
scaler's `apply(desired, ready)` whenever the numbers change. Scalers never raise into the
gateway: a scaler that cannot reach its target logs why and tries again on the next change,
because the admission loop must keep running whether or not the cloud answers.

The gateway picks one by name (see `scaler_from_name`): `none`, `prometheus`
(KEDA reads the metric), `command`, `webhook` or `simulated` (the demo's).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from traitlets import Dict, Float, Instance, List, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable
from traitlets.utils.importstring import import_item

from ..devices import NodeInfo, SimulatedInventory

if TYPE_CHECKING:
    from ..admission.core import AdmissionCore


class Scaler(LoggingConfigurable):
    """Base class: receives the desired and ready node counts per flavor.

    Subclasses override `apply`. The base keeps `last_applied`, the desired counts each
    flavor was last successfully handed to the target, so that subclasses act only on
    flavors whose demand changed and retry the ones that failed.
    """

    # True when the admission core itself models provisioning (provision_delay, then
    # node_ready) and the gateway adds the node to its inventory on node_ready. Only the
    # simulated scaler does; real scalers' nodes show up in the inventory by themselves.
    manages_provisioning: bool = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.last_applied: dict[str, int] = {}
        self._apply_lock = asyncio.Lock()

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        """Called whenever the desired node count of some flavor changes. Never raises."""

    def node_ready(self, flavor: str, name: str, gpus: int | None = None) -> NodeInfo | None:
        """The core declared node `name` ready (only when `manages_provisioning`); the
        node it now stands for, if the scaler keeps an inventory. A no-op by default."""
        return None

    def node_removed(self, name: str) -> None:
        """The core scaled node `name` down (only when `manages_provisioning`). A no-op
        by default."""

    def queue_changed(self, core: AdmissionCore) -> None:
        """Called after every committed change, before `apply`: scalers that act per
        capacity-blocked request (ProvisioningRequestScaler) read the queue here through
        the core's queries. Must not block or raise. A no-op by default."""

    def changed(self, desired: Mapping[str, int]) -> dict[str, int]:
        """Flavors whose desired count differs from what was last applied successfully."""
        return {f: n for f, n in desired.items() if self.last_applied.get(f) != n}


class NoneScaler(Scaler):
    """No scale-up: the cluster is what it is; blocked requests wait for free devices."""


class PrometheusScaler(Scaler):
    """Scale-up by metric only.

    The gateway already exports `gpuaas_desired_nodes{flavor}` at `metrics`; point a KEDA
    ScaledObject (prometheus trigger, one per flavor) or any autoscaler that reads
    Prometheus at it. This scaler therefore does nothing but log the change at debug level.
    """

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        for flavor, n in self.changed(desired).items():
            self.log.debug("desired %s nodes: %d (ready %d)", flavor, n, ready.get(flavor, 0))
            self.last_applied[flavor] = n


_PLACEHOLDERS = {"flavor": "a100", "desired": "1", "ready": "0"}


class CommandScaler(Scaler):
    """Runs a command per flavor whose desired node count changed."""

    argv = List(
        Unicode(),
        help="""
        The command to run, as a list of arguments (no shell), when a flavor's desired node
        count changes. `{flavor}`, `{desired}` and `{ready}` in any argument are replaced
        by the flavor, the desired node count and the ready node count, e.g.

            c.CommandScaler.argv = ["/opt/bin/scale-pool", "--pool", "gpu-{flavor}",
                                    "--size", "{desired}"]

        A non-zero exit is logged with its stderr and retried on the next change.
        """,
    ).tag(config=True)

    timeout = Float(
        60.0,
        help="Seconds the command may run before it is killed and counted as failed.",
    ).tag(config=True)

    env = Dict(
        value_trait=Unicode(),
        help="Extra environment variables for the command, added to the gateway's own.",
    ).tag(config=True)

    @validate("argv")
    def _validate_argv(self, proposal: Any) -> list[str]:
        argv: list[str] = proposal["value"]
        for arg in argv:
            try:
                arg.format(**_PLACEHOLDERS)
            except (KeyError, IndexError, ValueError) as e:
                raise TraitError(
                    f"CommandScaler.argv: bad placeholder in {arg!r} ({e}); "
                    "use {flavor}, {desired} or {ready}, and {{ }} for literal braces"
                ) from e
        return argv

    @validate("timeout")
    def _validate_timeout(self, proposal: Any) -> float:
        if proposal["value"] <= 0:
            raise TraitError("CommandScaler.timeout must be positive")
        return float(proposal["value"])

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        if not self.argv:
            self.log.warning("CommandScaler has no argv: set c.CommandScaler.argv")
            return
        async with self._apply_lock:
            for flavor, n in self.changed(desired).items():
                if await self._run(flavor, n, ready.get(flavor, 0)):
                    self.last_applied[flavor] = n

    async def _run(self, flavor: str, desired: int, ready: int) -> bool:
        values = {"flavor": flavor, "desired": str(desired), "ready": str(ready)}
        argv = [arg.format(**values) for arg in self.argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **self.env},
            )
        except OSError as e:
            self.log.error("scale command %s could not start: %s", argv[0], e)
            return False
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), self.timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            self.log.error("scale command %s killed after %.0fs", argv, self.timeout)
            return False
        if proc.returncode != 0:
            self.log.error(
                "scale command %s exited %s: %s",
                argv,
                proc.returncode,
                stderr.decode(errors="replace").strip()[-2000:],
            )
            return False
        self.log.info("scaled %s to %d nodes (ready %d) via %s", flavor, desired, ready, argv[0])
        return True


class WebhookScaler(Scaler):
    """POSTs `{"flavor", "desired_nodes", "ready_nodes"}` per flavor whose demand changed."""

    url = Unicode(
        "",
        help="""
        The URL to POST to. The body is JSON
        `{"flavor": "a100", "desired_nodes": 3, "ready_nodes": 2}`, one request per flavor
        whose desired count changed. Any 2xx answer counts as delivered; anything else is
        logged and retried on the next change.
        """,
    ).tag(config=True)

    headers = Dict(
        value_trait=Unicode(),
        help="Extra HTTP headers, e.g. {'Authorization': 'Bearer …'}.",
    ).tag(config=True)

    timeout = Float(10.0, help="Seconds to wait for the webhook to answer.").tag(config=True)

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        if not self.url:
            self.log.warning("WebhookScaler has no url: set c.WebhookScaler.url")
            return
        async with self._apply_lock:
            for flavor, n in self.changed(desired).items():
                if await self._post(flavor, n, ready.get(flavor, 0)):
                    self.last_applied[flavor] = n

    async def _post(self, flavor: str, desired: int, ready: int) -> bool:
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        body = json.dumps({"flavor": flavor, "desired_nodes": desired, "ready_nodes": ready})
        request = HTTPRequest(
            self.url,
            method="POST",
            body=body,
            headers={"Content-Type": "application/json", **self.headers},
            request_timeout=self.timeout,
            connect_timeout=self.timeout,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception as e:  # DNS, refused connection, TLS: the target is unreachable
            self.log.error("scale webhook %s failed for %s: %s", self.url, flavor, e)
            return False
        if not 200 <= response.code < 300:
            detail = response.error or (response.body or b"")[:500].decode(errors="replace")
            self.log.error(
                "scale webhook %s answered %s for %s: %s", self.url, response.code, flavor, detail
            )
            return False
        self.log.info("scaled %s to %d nodes (ready %d) via webhook", flavor, desired, ready)
        return True


class SimulatedScaler(Scaler):
    """The demo's scaler: the core models provisioning, this mirrors it into the inventory.

    The admission core, told `provision: simulated`, emits node_ready after the flavor's
    provision_delay and scale_down for nodes idle past scale_down_after; the gateway calls
    `node_ready` and `node_removed` here so the simulated inventory (and so the devices
    page and metrics) follow the core's decisions.
    """

    manages_provisioning = True

    inventory = Instance(
        SimulatedInventory,
        allow_none=True,
        help="The simulated inventory to add nodes to and remove them from (set by the gateway).",
    )

    async def apply(self, desired: Mapping[str, int], ready: Mapping[str, int]) -> None:
        for flavor, n in self.changed(desired).items():
            self.log.info(
                "simulated scale: %s wants %d nodes (%d ready)", flavor, n, ready.get(flavor, 0)
            )
            self.last_applied[flavor] = n

    def node_ready(self, flavor: str, name: str, gpus: int | None = None) -> NodeInfo | None:
        """Add the node the core declared ready; a node already present is left as is."""
        if self.inventory is None:
            self.log.warning("simulated node %s ready, but no inventory to add it to", name)
            return None
        existing = {n.name: n for n in self.inventory.nodes()}
        if name in existing:
            return existing[name]
        return self.inventory.add_node(flavor, gpus, name=name)

    def node_removed(self, name: str) -> None:
        """Remove the node the core scaled down; unknown names are ignored (idempotent)."""
        if self.inventory is None:
            return
        try:
            self.inventory.remove_node(name)
        except KeyError:
            self.log.debug("simulated node %s already gone", name)


SCALERS: dict[str, type[Scaler]] = {
    "none": NoneScaler,
    "prometheus": PrometheusScaler,
    "command": CommandScaler,
    "webhook": WebhookScaler,
    "simulated": SimulatedScaler,
}


def scaler_from_name(name: str, parent: Any = None, config: Any = None) -> Scaler:
    """Instantiate a scaler by short name or dotted class path.

    Raises ValueError listing the choices for an unknown name or a class that is not a
    Scaler.
    """
    choices = ", ".join(SCALERS)
    cls: Any = SCALERS.get(name.strip().lower())
    if cls is None and "." in name:
        try:
            cls = import_item(name.strip())
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot import scaler {name!r}: {e}") from e
    if cls is None:
        raise ValueError(f"unknown scaler {name!r}: choose one of {choices} or a dotted class")
    if not (isinstance(cls, type) and issubclass(cls, Scaler)):
        raise ValueError(f"{name!r} is not a Scaler subclass (choices: {choices})")
    kwargs: dict[str, Any] = {}
    if parent is not None:
        kwargs["parent"] = parent
    if config is not None:
        kwargs["config"] = config
    scaler: Scaler = cls(**kwargs)
    return scaler
