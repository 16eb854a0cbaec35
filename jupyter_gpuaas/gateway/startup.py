"""The gateway's start-up and shut-down: read the files, open the store, restore the
core, listen; then stop in order (the HTTP server, leadership, the arbiter's last commit,
the lock, the scaler, the store). A mixin of `GatewayApp` (app.py), whose traits (the
command line and the config file) these methods read.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any

import yaml
from tornado import httpserver, netutil, web
from tornado.log import access_log

if TYPE_CHECKING:
    from ..devices import Inventory


def log_request(handler: web.RequestHandler) -> None:
    """The access log: a read that went well is routine (the Hub's service check every
    minute, health probes, pollers) and logged at debug; a change, and every refusal or
    error, at info, warning or error as tornado would."""
    status = handler.get_status()
    request = handler.request
    if status < 400 and request.method in ("GET", "HEAD", "OPTIONS"):
        log = access_log.debug
    elif status < 400:
        log = access_log.info
    elif status < 500:
        log = access_log.warning
    else:
        log = access_log.error
    log(
        "%d %s %s (%s) %.2fms",
        status,
        request.method,
        request.uri,
        request.remote_ip,
        1000.0 * request.request_time(),
    )


class StartupError(Exception):
    """Bad configuration: printed as one line, exit status 2."""


class GatewayStartup:
    """Start-up and shut-down of the gateway (the traits are GatewayApp's)."""

    # GatewayApp's traits (app.py) and the logger of its Application, as read here.
    ip: str
    port: int
    base_url: str
    db_url: str
    quotas: str
    devices: str
    tokens: str
    lease_ttl: float
    gc_threshold: int
    scaler: str
    keepalive_interval: float
    tick_interval: float
    sample_interval: float
    event_replay_window: int
    metrics_public: bool
    grafana_url: str
    metrics_user_label: bool
    hub_auth_cache_max_age: int
    hub_outage_grace: float
    service_name: str
    hub_service: bool
    store_lock_timeout: float
    store_timeout: float
    history_retention: float
    max_body_size: int
    max_queued_per_user: int
    header_timeout: float
    body_timeout: float
    leader_election: str
    leader_check_interval: float
    forward_writes: bool
    advertise_url: str
    admission: str
    advice_min_grants: int
    advice_cache_seconds: float
    advice_deadline: float
    kueue_namespace: str
    kueue_interval: float
    kueue_intent_timeout: float
    log: logging.Logger | logging.LoggerAdapter[Any]
    inventory: Inventory

    if TYPE_CHECKING:

        def _server_ssl(self) -> ssl.SSLContext | None: ...

        def _cookie_secret(self) -> bytes: ...

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

        kueue = None
        if self.admission == "kueue":
            from ..kubeapi.workloads import WorkloadWatch
            from .kueue_engine import KueueEngine

            watch = WorkloadWatch(namespace=self.kueue_namespace)
            kueue = KueueEngine(
                watch, interval=self.kueue_interval, intent_timeout=self.kueue_intent_timeout
            )
        try:
            self.arbiter = Arbiter(
                quotas=quotas,
                store=self.store,
                inventory=self.inventory,
                metrics=GatewayMetrics(
                    user_label=self.metrics_user_label, devices=self.inventory.devices
                ),
                scaler=self.scaler_obj,
                bus=EventBus(replay_window=self.event_replay_window),
                # Kueue has no leases: a grant lasts as long as its Workload's admission.
                lease_ttl=0.0 if kueue is not None else self.lease_ttl,
                tick=self.tick_interval,
                sample_interval=self.sample_interval,
                lock_timeout=self.store_lock_timeout,
                retention=self.history_retention,
                store_timeout=self.store_timeout,
                kueue=kueue,
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
        from .advice_cache import AdviceCache
        from .handlers import NotFoundHandler, routes
        from .pages import oauth_callback_handler
        from .pages import routes as page_routes

        settings: dict[str, Any] = {
            "arbiter": self.arbiter,
            "tokens": self.token_table,
            "base_url": self.base_url,
            "keepalive_interval": self.keepalive_interval,
            "metrics_public": self.metrics_public,
            "grafana_url": self.grafana_url,
            "service_name": self.service_name,
            "max_body_size": self.max_body_size,
            "max_queued_per_user": self.max_queued_per_user,
            "advice_min_grants": self.advice_min_grants,
            "advice_cache": AdviceCache(self.advice_cache_seconds, self.advice_deadline),
            "forward_writes": self.forward_writes,
            "default_handler_class": NotFoundHandler,
            "log_function": log_request,
        }
        handlers: list[Any] = list(routes(self.base_url)) + page_routes(self.base_url)
        if self.hub_service:
            # Browsers sign in with the Hub's OAuth (the landing page); programs send a
            # token. XSRF is checked on every cookie-authenticated change (handlers.py).
            # A token the Hub vouched for keeps working while the Hub is down (hubauth.py).
            from .hubauth import OutageTolerantHubOAuth

            hub_auth = OutageTolerantHubOAuth(
                api_token=os.environ["JUPYTERHUB_API_TOKEN"],
                cache_max_age=self.hub_auth_cache_max_age,
                outage_grace=self.hub_outage_grace,
                parent=self,
            )
            settings["hub_auth"] = hub_auth
            settings["cookie_secret"] = self._cookie_secret()
            handlers.append((f"{self.base_url}oauth_callback", oauth_callback_handler()))
        return web.Application(handlers, **settings)

    async def start_server(self) -> int:
        """Build, restore the core from the store, listen. Returns the bound port."""
        tls = self._server_ssl()  # bad certificate files: refused before the store opens
        self.build()
        prepare = getattr(self.inventory, "prepare", None)
        if prepare is not None:  # a watched inventory lists its nodes before the restore
            try:
                await prepare()
            except Exception as e:
                raise StartupError(f"--devices {self.devices}: cannot list the nodes: {e}") from e
        from .store import StoreUnavailable

        self.leadership = self._leadership()
        try:
            if self.leadership is None or self.leadership.start_sync():
                self.arbiter.restore(time.time())
        except StoreUnavailable as e:
            raise StartupError(f"--db-url: cannot restore from the store: {e.message}") from None
        self.arbiter.start()
        if self.leadership is not None:
            self.leadership.start()
        self.http_server = httpserver.HTTPServer(
            self.make_app(),
            idle_connection_timeout=self.header_timeout,
            body_timeout=self.body_timeout,
            # The outer bound; the API's routes refuse past max_body_size themselves, with
            # a JSON 413, before reading (handlers.BodyHandler).
            max_body_size=2 * self.max_body_size,
            ssl_options=tls,
        )
        sockets = netutil.bind_sockets(self.port, self.ip, family=socket.AF_INET)
        self.http_server.add_sockets(sockets)
        self.bound_port = sockets[0].getsockname()[1]
        if self.leadership is not None and not self.advertise_url:  # --port 0: now known
            scheme = "https" if tls else "http"
            self.leadership.election.advertise(
                f"{scheme}://{self.ip}:{self.bound_port}{self.base_url}"
            )
        mode = "JupyterHub service" if self.hub_service else "standalone"
        self.log.info(
            "gpuaas gateway (%s) on %s://%s:%d%s, store %s, %d nodes",
            mode,
            "https" if tls else "http",
            self.ip,
            self.bound_port,
            self.base_url,
            self.db_url.split("@")[-1],
            len(self.arbiter.core.nodes()),
        )
        return int(self.bound_port)

    def _leadership(self) -> Any:
        """The election of leader.py, when replicas may share this store (else None)."""
        from .leader import AdvisoryLockElection, Leadership

        postgres = self.db_url.startswith("postgresql")
        if self.leader_election == "off" or (self.leader_election == "auto" and not postgres):
            return None
        if not postgres:
            raise StartupError("--leader-election=on needs a PostgreSQL store (--db-url)")
        url = self.advertise_url or f"http://{self.ip}:{self.port}{self.base_url}"
        election = AdvisoryLockElection(self.db_url, url)
        election.attach(self.store.engine)
        self.store.fence = election.fence
        return Leadership(self.arbiter, election, self.leader_check_interval)

    async def stop_server(self) -> None:
        self.http_server.stop()
        leadership = getattr(self, "leadership", None)
        if leadership is not None:
            await leadership.stop()  # no take-over while stopping
        await self.arbiter.stop()
        if leadership is not None:
            leadership.election.release()  # after the last commit: the lock goes last
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
