"""`jupyter-gpuaas gateway`: the arbiter service, standalone or as a JupyterHub service.

Standalone it reads tokens from a file; as the JupyterHub-managed service `gpuaas` (the Hub
sets JUPYTERHUB_SERVICE_NAME, JUPYTERHUB_API_TOKEN and JUPYTERHUB_API_URL) it asks the Hub
who is calling and maps the custom scopes `custom:gpuaas:{use,view,admin}` (auth.py).
Every knob is a trait, so `--config gateway_config.py` sets the same things as the flags.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from tornado import httpserver, netutil, web
from traitlets import Bool, Float, Integer, Unicode, default, validate
from traitlets.config import Application

from jupyter_gpuaas._version import __version__

log = logging.getLogger("jupyter_gpuaas.gateway")


class StartupError(Exception):
    """Bad configuration: printed as one line, exit status 2."""


class GatewayApp(Application):
    name = "jupyter-gpuaas-gateway"
    version = __version__
    description = "The jupyter-gpuaas gateway: GPU admission, quotas and leases over HTTP."

    aliases = {
        "ip": "GatewayApp.ip",
        "port": "GatewayApp.port",
        "base-url": "GatewayApp.base_url",
        "db-url": "GatewayApp.db_url",
        "quotas": "GatewayApp.quotas",
        "devices": "GatewayApp.devices",
        "tokens": "GatewayApp.tokens",
        "lease-ttl": "GatewayApp.lease_ttl",
        "scaler": "GatewayApp.scaler",
        "config": "GatewayApp.config_file",
        "cookie-secret-file": "GatewayApp.cookie_secret_file",
        "log-level": "Application.log_level",
    }
    flags = {
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log at debug level."),
    }

    config_file = Unicode(
        "", help="A Python config file (`c.GatewayApp.port = 9000`) loaded before the flags."
    ).tag(config=True)

    ip = Unicode(help="Address to listen on. As a Hub service: from JUPYTERHUB_SERVICE_URL.").tag(
        config=True
    )

    @default("ip")
    def _ip_default(self) -> str:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).hostname or "127.0.0.1") if url else "127.0.0.1"

    port = Integer(help="Port to listen on. As a Hub service: from JUPYTERHUB_SERVICE_URL.").tag(
        config=True
    )

    @default("port")
    def _port_default(self) -> int:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).port or 8765) if url else 8765

    @validate("port")
    def _validate_port(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if not 0 <= value <= 65535:
            raise ValueError(f"port must be 0..65535, not {value}")
        return value

    base_url = Unicode(
        help="URL prefix of every route. As a Hub service: JUPYTERHUB_SERVICE_PREFIX "
        "(/services/gpuaas/)."
    ).tag(config=True)

    @default("base_url")
    def _base_url_default(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")

    @validate("base_url")
    def _validate_base_url(self, proposal: Any) -> str:
        value = "/" + str(proposal["value"]).strip("/") + "/"
        return value.replace("//", "/")

    db_url = Unicode(
        "sqlite:///gpuaas.sqlite",
        help="SQLAlchemy URL of the store: sqlite:///path (WAL) or postgresql://user@host/db.",
    ).tag(config=True)

    quotas = Unicode(
        "",
        help="YAML file with the `flavors`, `tenants` and `policy` blocks of the scenario "
        "format (SCENARIO.md): the same quota format as `jupyter-gpuaas simulate`.",
    ).tag(config=True)

    devices = Unicode(
        "nvml",
        help="Where GPUs come from: `nvml` (this machine), `nvml:flavor=a100`, or "
        "`simulated:a100=2x4,t4=1x8` (invented nodes, said loudly in every answer).",
    ).tag(config=True)

    tokens = Unicode(
        "",
        help="Standalone mode: YAML `tokens: {TOKEN: {user, groups, admin, view}}`. "
        "Ignored as a JupyterHub service (the Hub identifies callers).",
    ).tag(config=True)

    lease_ttl = Float(
        120.0,
        help="Seconds an admitted holder may go without a heartbeat before its grant is "
        "released (0: no leases). Overrides policy.lease_ttl of the quota file.",
    ).tag(config=True)

    gc_threshold = Integer(
        50_000,
        help="Allocations between the garbage collector's youngest-generation passes "
        "(Python's default is 700). Start-up objects are frozen out of collection and "
        "passes made rarer, so a long queue costs no stop-the-world pauses under load; "
        "the gateway's data has few reference cycles, so memory stays flat.",
    ).tag(config=True)

    @validate("lease_ttl", "keepalive_interval", "tick_interval", "sample_interval")
    def _validate_non_negative(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if value < 0:
            raise ValueError(f"{proposal['trait'].name} must be >= 0, not {value}")
        return value

    scaler = Unicode(
        "none",
        help="Scale-up target: none, prometheus (KEDA reads gpuaas_desired_nodes), command, "
        "webhook, simulated (the demo: nodes join after provision_delay), or a dotted class.",
    ).tag(config=True)

    keepalive_interval = Float(
        15.0, help="Seconds between `: keepalive` comments on idle event streams."
    ).tag(config=True)

    tick_interval = Float(
        1.0,
        help="Longest sleep of the admission loop; it also wakes at the core's next deadline.",
    ).tag(config=True)

    sample_interval = Float(5.0, help="Seconds between device samples (NVML or simulated).").tag(
        config=True
    )

    metrics_require_auth = Bool(
        False, help="Require a gpuaas token for GET metrics (default: anyone may scrape)."
    ).tag(config=True)

    service_name = Unicode(
        help="The JupyterHub service name (scopes say `access:services!service=<name>`)."
    ).tag(config=True)

    @default("service_name")
    def _service_name_default(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpuaas")

    hub_service = Bool(
        help="Run as a JupyterHub service (identify callers through the Hub). Default: true "
        "when JUPYTERHUB_API_TOKEN and JUPYTERHUB_API_URL are set."
    ).tag(config=True)

    @default("hub_service")
    def _hub_service_default(self) -> bool:
        return bool(os.environ.get("JUPYTERHUB_API_TOKEN") and os.environ.get("JUPYTERHUB_API_URL"))

    cookie_secret_file = Unicode(
        "gpuaas_cookie_secret",
        help="As a Hub service: the file with the key that signs the browser's login cookie "
        "(HubOAuth), relative to the working directory. Created with 32 random bytes, mode "
        "0600, when missing; kept across restarts so they do not log browsers out, as "
        "JupyterHub's own cookie_secret_file. A file others may read is refused.",
    ).tag(config=True)

    def _cookie_secret(self) -> bytes:
        from .auth import CookieSecretError, load_cookie_secret

        try:
            return load_cookie_secret(self.cookie_secret_file)
        except (CookieSecretError, OSError) as e:
            raise StartupError(f"--cookie-secret-file: {e}") from None

    # --- the store and the HTTP edge (bounds of what one client may cost the others) ---

    store_lock_timeout = Float(
        2.0,
        min=0.0,
        help="Seconds operations wait, queued, while another process holds the store's "
        "write lock (retried every 50 ms without blocking the event loop); then they are "
        "answered 503 with Retry-After. Nothing is decided before the lock is held.",
    ).tag(config=True)

    history_retention = Float(
        30 * 86400.0,
        min=0.0,
        help="Seconds ended and rejected requests (and their decisions) are kept in the "
        "store, counted from their last change; older ones are pruned a batch at a time "
        "by the admission loop. 0 keeps them forever.",
    ).tag(config=True)

    max_body_size = Integer(
        64 * 1024,
        min=1024,
        help="Largest request body in bytes. The API's routes authenticate the caller "
        "first, then refuse a larger Content-Length with 413 before reading the body, and a "
        "chunked body as soon as it passes the limit; the HTTP server buffers no more.",
    ).tag(config=True)

    header_timeout = Float(
        60.0,
        min=1.0,
        help="Seconds a connection may take to send a request's headers, counted from when "
        "the connection is ready for it (also how long an idle keep-alive connection stays).",
    ).tag(config=True)

    body_timeout = Float(
        30.0,
        min=1.0,
        help="Seconds a client may take to send a request's body.",
    ).tag(config=True)

    # ------------------------------------------------------------------ lifecycle

    def initialize(self, argv: Any = None) -> None:
        super().initialize(argv)
        if self.config_file:
            path = Path(self.config_file)
            if not path.is_file():
                raise StartupError(f"--config {self.config_file}: no such file")
            self.load_config_file(path.name, path=str(path.parent))
            # Flags given on the command line win over the file.
            self.update_config(self.cli_config)

    def build(self) -> None:
        """Read files, open the store and build the arbiter (no network yet)."""
        from ..devices import SimulatedInventory, parse_devices_spec
        from .arbiter import Arbiter
        from .auth import TokenError, TokenTable
        from .events import EventBus
        from .metrics import GatewayMetrics
        from .scalers import scaler_from_name
        from .store import Store

        quotas = self._read_yaml(self.quotas, "--quotas")
        if not isinstance(quotas, dict):
            raise StartupError(f"--quotas {self.quotas}: must be a mapping")
        try:
            if self.devices.strip() == "kubernetes":  # the cluster's Nodes, followed live
                from .cluster import ClusterInventory

                self.inventory = ClusterInventory(parent=self)
            else:
                self.inventory = parse_devices_spec(self.devices)
        except ValueError as e:
            raise StartupError(f"--devices: {e}") from None
        if self.inventory.simulated:
            self.log.warning("SIMULATED devices (%s): no real GPU is granted", self.devices)
        try:
            self.scaler_obj = scaler_from_name(self.scaler, parent=self)
        except ValueError as e:
            raise StartupError(f"--scaler: {e}") from None
        if self.scaler_obj.manages_provisioning:
            if not isinstance(self.inventory, SimulatedInventory):
                raise StartupError("--scaler simulated needs --devices simulated:...")
            self.scaler_obj.inventory = self.inventory  # type: ignore[attr-defined]
        self.token_table = TokenTable()
        if not self.hub_service:
            if not self.tokens:
                raise StartupError("--tokens FILE is required outside JupyterHub")
            try:
                self.token_table = TokenTable.parse(self._read_yaml(self.tokens, "--tokens"))
            except TokenError as e:
                raise StartupError(f"--tokens {self.tokens}: {e}") from None
        from .store import describe

        try:
            self.store = Store.open(self.db_url)
        except Exception as e:
            raise StartupError(f"--db-url: cannot open the store: {describe(e)}") from None
        from jupyter_gpuaas.admission.config import SpecError

        try:
            self.arbiter = Arbiter(
                quotas=quotas,
                store=self.store,
                inventory=self.inventory,
                metrics=GatewayMetrics(),
                scaler=self.scaler_obj,
                bus=EventBus(),
                lease_ttl=self.lease_ttl,
                tick=self.tick_interval,
                sample_interval=self.sample_interval,
                lock_timeout=self.store_lock_timeout,
                retention=self.history_retention,
            )
        except SpecError as e:
            raise StartupError(f"--quotas {self.quotas}: {e}") from None

    def _read_yaml(self, path: str, flag: str) -> Any:
        if not path:
            raise StartupError(f"{flag} FILE is required")
        try:
            with open(path, encoding="utf-8") as f:
                return yaml.safe_load(f)
        except OSError as e:
            raise StartupError(f"{flag} {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise StartupError(f"{flag} {path}: not valid YAML: {e}") from None

    def make_app(self) -> web.Application:
        from .handlers import NotFoundHandler, routes
        from .pages import oauth_callback_handler
        from .pages import routes as page_routes

        settings: dict[str, Any] = {
            "arbiter": self.arbiter,
            "tokens": self.token_table,
            "base_url": self.base_url,
            "keepalive_interval": self.keepalive_interval,
            "metrics_require_auth": self.metrics_require_auth,
            "service_name": self.service_name,
            "max_body_size": self.max_body_size,
            "default_handler_class": NotFoundHandler,
        }
        handlers: list[Any] = list(routes(self.base_url)) + page_routes(self.base_url)
        if self.hub_service:
            # Browsers sign in with the Hub's OAuth (the landing page); programs send a
            # token. XSRF is checked on every cookie-authenticated change (handlers.py).
            from jupyterhub.services.auth import HubOAuth  # type: ignore[import-untyped]

            hub_auth = HubOAuth(
                api_token=os.environ["JUPYTERHUB_API_TOKEN"], cache_max_age=60, parent=self
            )
            settings["hub_auth"] = hub_auth
            settings["cookie_secret"] = self._cookie_secret()
            handlers.append((f"{self.base_url}oauth_callback", oauth_callback_handler()))
        return web.Application(handlers, **settings)

    async def start_server(self) -> int:
        """Build, restore the core from the store, listen. Returns the bound port."""
        self.build()
        prepare = getattr(self.inventory, "prepare", None)
        if prepare is not None:  # a watched inventory lists its nodes before the restore
            try:
                await prepare()
            except Exception as e:
                raise StartupError(f"--devices {self.devices}: cannot list the nodes: {e}") from e
        from .store import StoreUnavailable

        try:
            self.arbiter.restore(time.time())
        except StoreUnavailable as e:
            raise StartupError(f"--db-url: cannot restore from the store: {e.message}") from None
        self.arbiter.start()
        self.http_server = httpserver.HTTPServer(
            self.make_app(),
            idle_connection_timeout=self.header_timeout,
            body_timeout=self.body_timeout,
            # The outer bound; the API's routes refuse past max_body_size themselves, with
            # a JSON 413, before reading (handlers.BodyHandler).
            max_body_size=2 * self.max_body_size,
        )
        sockets = netutil.bind_sockets(self.port, self.ip, family=socket.AF_INET)
        self.http_server.add_sockets(sockets)
        self.bound_port = sockets[0].getsockname()[1]
        mode = "JupyterHub service" if self.hub_service else "standalone"
        self.log.info(
            "gpuaas gateway (%s) on http://%s:%d%s, store %s, %d nodes",
            mode,
            self.ip,
            self.bound_port,
            self.base_url,
            self.db_url.split("@")[-1],
            len(self.arbiter.core.nodes()),
        )
        return int(self.bound_port)

    async def stop_server(self) -> None:
        self.http_server.stop()
        await self.arbiter.stop()
        await self.scaler_close()
        self.store.close()
        self.inventory.close()
        aclose = getattr(self.inventory, "aclose", None)
        if aclose is not None:
            await aclose()

    async def scaler_close(self) -> None:
        close = getattr(self.scaler_obj, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result

    async def _serve(self) -> None:
        await self.start_server()
        # What start-up built (config, routes, restored queue) lives as long as the
        # process: keep it out of the collector's full passes, and make those rarer, so a
        # large queue does not cost the event loop stop-the-world pauses under load.
        gc.collect()
        gc.freeze()
        gc.set_threshold(self.gc_threshold, 20, 20)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        self.log.info("stopping")
        await self.stop_server()

    def start(self) -> None:
        asyncio.run(self._serve())


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s gpuaas] %(message)s"
    )
    app = GatewayApp()
    try:
        try:
            app.initialize(argv)
        except SystemExit as e:
            # traitlets reports a bad flag or config file itself (one CRITICAL line) and
            # exits 1; bad input is exit status 2 everywhere in jupyter-gpuaas.
            return 2 if e.code == 1 else int(e.code or 0)
        app.start()
    except StartupError as e:
        print(f"jupyter-gpuaas gateway: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # traitlets validation of a flag, a bad config file
        if type(e).__name__ in ("TraitError", "ArgumentError", "ValueError"):
            print(f"jupyter-gpuaas gateway: {e}", file=sys.stderr)
            return 2
        raise
    return 0


def add_parser(subparsers: Any) -> None:
    # The traitlets Application parses its own flags: hand it everything after `gateway`.
    p = subparsers.add_parser(
        "gateway",
        help="run the gateway service (standalone or as a JupyterHub service)",
        add_help=False,
        prefix_chars="\x00",
    )
    p.add_argument("argv", nargs="*")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return main(list(args.argv))


if __name__ == "__main__":
    sys.exit(main())
