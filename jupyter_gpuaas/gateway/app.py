"""`jupyter-gpuaas gateway`: the arbiter service, standalone or as a JupyterHub service.

Standalone it reads tokens from a file; as the JupyterHub-managed service `gpuaas` (the Hub
sets JUPYTERHUB_SERVICE_NAME, JUPYTERHUB_API_TOKEN and JUPYTERHUB_API_URL) it asks the Hub
who is calling and maps the custom scopes `custom:gpuaas:{use,view,admin}` (auth.py).
Every knob is a trait, so `--config gateway_config.py` sets the same things as the flags.
"""

from __future__ import annotations

import logging
import os
import ssl
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from traitlets import Bool, Enum, Float, Integer, Unicode, default, validate
from traitlets.config import Application

from jupyter_gpuaas._version import __version__
from jupyter_gpuaas.kubeapi.connect import own_namespace

from .startup import GatewayStartup, StartupError

log = logging.getLogger("jupyter_gpuaas.gateway")


class GatewayApp(GatewayStartup, Application):
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
        "grafana-url": "GatewayApp.grafana_url",
        "scaler": "GatewayApp.scaler",
        "config": "GatewayApp.config_file",
        "cookie-secret-file": "GatewayApp.cookie_secret_file",
        "ssl-keyfile": "GatewayApp.ssl_keyfile",
        "ssl-certfile": "GatewayApp.ssl_certfile",
        "ssl-client-ca": "GatewayApp.ssl_client_ca",
        "leader-election": "GatewayApp.leader_election",
        "leader-check-interval": "GatewayApp.leader_check_interval",
        "advertise-url": "GatewayApp.advertise_url",
        "admission": "GatewayApp.admission",
        "kueue-namespace": "GatewayApp.kueue_namespace",
        "log-level": "Application.log_level",
    }
    flags = {
        "debug": ({"Application": {"log_level": logging.DEBUG}}, "Log at debug level."),
        "metrics-public": (
            {"GatewayApp": {"metrics_public": True}},
            "Let anyone scrape GET metrics, without a token.",
        ),
        "metrics-user-label": (
            {"GatewayApp": {"metrics_user_label": True}},
            "Name the holder of each device in the metrics' `user` label.",
        ),
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

    port = Integer(
        min=0, max=65535, help="Port to listen on. As a Hub service: from JUPYTERHUB_SERVICE_URL."
    ).tag(config=True)

    @default("port")
    def _port_default(self) -> int:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).port or 8765) if url else 8765

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
        min=0.0,
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

    scaler = Unicode(
        "none",
        help="Scale-up target: none, prometheus (KEDA reads gpuaas_desired_nodes), command, "
        "webhook, simulated (the demo: nodes join after provision_delay), or a dotted class.",
    ).tag(config=True)

    keepalive_interval = Float(
        15.0, min=0.0, help="Seconds between `: keepalive` comments on idle event streams."
    ).tag(config=True)

    tick_interval = Float(
        1.0,
        min=0.0,
        help="Longest sleep of the admission loop; it also wakes at the core's next deadline.",
    ).tag(config=True)

    sample_interval = Float(
        5.0, min=0.0, help="Seconds between device samples (NVML or simulated)."
    ).tag(config=True)

    event_replay_window = Integer(
        10_000,
        min=0,
        help="Events the gateway keeps (as sent, a few hundred bytes each) so that an event "
        "stream reconnecting with Last-Event-ID gets exactly what it missed. A client that "
        "missed more, or reconnects to a restarted gateway, gets a `reset` event and "
        "relists instead. 0: no replay, every reconnect is a reset.",
    ).tag(config=True)

    metrics_public = Bool(
        False,
        help="Let anyone scrape GET metrics. By default a scrape needs a token with the "
        "view scope (custom:gpuaas:view, or `view: true` in the token file), as "
        "JupyterHub's own /metrics does unless authenticate_prometheus is off: the series "
        "name tenants and the queue's shape, and the gateway may be behind the public proxy.",
    ).tag(config=True)

    grafana_url = Unicode(
        "",
        help="URL of the jupyter-gpuaas dashboard in Grafana (hub_config/grafana/"
        "jupyter-gpuaas.json, uid jupyter-gpuaas), e.g. "
        "https://grafana.example.org/d/jupyter-gpuaas/jupyter-gpuaas. The landing page then "
        "links each tenant, for admins and viewers, to its row (`var-tenant=NAME`). Empty: "
        "no links.",
    ).tag(config=True)

    metrics_user_label = Bool(
        False,
        help="Fill the `user` label of the gpuaas_device_* series with the holder's user "
        "name. Off by default: the label stays, empty, so that user names never reach a "
        "scraper (or a long-term metrics store) unless asked for.",
    ).tag(config=True)

    ssl_keyfile = Unicode(
        help="Serve HTTPS with this private key (with ssl_certfile). Default: "
        "JUPYTERHUB_SSL_KEYFILE, which JupyterHub's internal SSL gives a managed service.",
    ).tag(config=True)

    @default("ssl_keyfile")
    def _ssl_keyfile_default(self) -> str:
        return os.environ.get("JUPYTERHUB_SSL_KEYFILE", "")

    ssl_certfile = Unicode(
        help="Serve HTTPS with this certificate (with ssl_keyfile). Default: "
        "JUPYTERHUB_SSL_CERTFILE.",
    ).tag(config=True)

    @default("ssl_certfile")
    def _ssl_certfile_default(self) -> str:
        return os.environ.get("JUPYTERHUB_SSL_CERTFILE", "")

    ssl_client_ca = Unicode(
        help="With HTTPS: accept only clients presenting a certificate this CA (bundle) "
        "signed, as JupyterHub's internal SSL verifies both ends. Empty: any client may "
        "connect (tokens still decide what it may do). Default: JUPYTERHUB_SSL_CLIENT_CA.",
    ).tag(config=True)

    @default("ssl_client_ca")
    def _ssl_client_ca_default(self) -> str:
        return os.environ.get("JUPYTERHUB_SSL_CLIENT_CA", "")

    def _server_ssl(self) -> ssl.SSLContext | None:
        if not (self.ssl_keyfile or self.ssl_certfile):
            return None
        if not (self.ssl_keyfile and self.ssl_certfile):
            raise StartupError("--ssl-keyfile and --ssl-certfile go together: give both")
        try:
            context = ssl.create_default_context(
                ssl.Purpose.CLIENT_AUTH, cafile=self.ssl_client_ca or None
            )
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        except (OSError, ssl.SSLError) as e:
            raise StartupError(f"--ssl-certfile/--ssl-keyfile/--ssl-client-ca: {e}") from None
        if self.ssl_client_ca:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    hub_auth_cache_max_age = Integer(
        60,
        min=1,
        help="As a Hub service: seconds the gateway trusts the Hub's answer about a token "
        "or login cookie before asking again (HubAuth.cache_max_age; 0 would mean forever "
        "there, so 1 is the least). A token the Hub revoked, or that expired, keeps working "
        "here for at most this long: lower it for quicker revocation, at one Hub API call "
        "per token and period.",
    ).tag(config=True)

    hub_outage_grace = Float(
        3600.0,
        min=0.0,
        help="As a Hub service: seconds a token the Hub identified keeps working while the "
        "Hub is unreachable, from the Hub's last answer about it and never past the "
        "token's own expiry (read with the service's read:tokens scope). Servers renew "
        "their own leases with their tokens, so they keep their GPUs through a Hub outage "
        "this long; a token the gateway never saw gets 503 meanwhile. 0: none.",
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

    store_timeout = Float(
        5.0,
        min=0.5,
        max=300.0,
        help="Seconds the gateway waits for its store to answer one call (a write of a "
        "group of decisions, a read). Store work runs off the event loop; past this the "
        "operation is answered 503 with Retry-After and nothing is changed, so a frozen "
        "database never freezes the gateway. PostgreSQL connections also carry "
        "connect_timeout, statement_timeout and lock_timeout.",
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

    max_queued_per_user = Integer(
        20,
        min=0,
        help="Most requests one user may have waiting in the queue at once; a submission "
        "past it is answered 429 with a sentence (cancel one, or wait for an admission). "
        "Admitted and parked requests do not count. 0: no limit.",
    ).tag(config=True)

    advice_min_grants = Integer(
        10,
        min=1,
        max=100_000,
        help="Fewest grants `GET api/advice` (and `jupyter-gpuaas advise`) bases a piece "
        "of advice on: a user's grants of one kind and flavor for a smaller GPU, a tenant's "
        "admitted requests of a flavor for moving its idle quota.",
    ).tag(config=True)

    advice_cache_seconds = Float(
        300.0,
        min=0.0,
        max=86400.0,
        help="Seconds `GET api/advice` reuses its answer for the same `since` before it "
        "reads and replays the store's history again (one replay serves every caller; a "
        "user is still shown only their own advice). 0: every call replays.",
    ).tag(config=True)

    advice_deadline = Float(
        10.0,
        min=0.1,
        max=600.0,
        help="Seconds a `GET api/advice` caller waits for a replay of the store's history. "
        "Past it the caller gets the last answer for that `since`, marked `stale`, or, "
        "when there is none yet, a 503 with Retry-After; the replay goes on and its answer "
        "is kept for the next caller.",
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

    # --- two gateways, one leader (leader.py) ---

    leader_election = Enum(
        ["auto", "on", "off"],
        "auto",
        help="Elect one leader among replicas sharing the store (a PostgreSQL advisory "
        "lock): the others are standbys that answer reads from the store and refuse "
        "changes with 503. auto: on with PostgreSQL, off with SQLite (one gateway, always "
        "the leader; `on` is refused there). off: this gateway assumes it is the only one.",
    ).tag(config=True)

    leader_check_interval = Float(
        1.0,
        min=0.1,
        max=60.0,
        help="Seconds between a standby's attempts to take the leader's lock (and "
        "refreshes of its read-only mirror of the store), and between the leader's checks "
        "that it still holds the lock. A killed leader is replaced within about this "
        "interval plus the time a restore takes.",
    ).tag(config=True)

    forward_writes = Bool(
        True,
        help="A standby sends each change (submit, cancel, heartbeat, quota) to the "
        "leader and answers with the leader's answer, so clients may call any replica "
        "(a Kubernetes Service). False: a standby refuses changes with 503 and "
        "Retry-After, naming the leader.",
    ).tag(config=True)

    advertise_url = Unicode(
        "",
        help="The URL other replicas name as the leader's in their 503 answers (at most "
        "63 bytes: PostgreSQL's application_name). Default: http://<ip>:<port><base_url>; "
        "in Kubernetes, the pod's own address.",
    ).tag(config=True)

    # --- who decides (engine.py) ---

    admission = Enum(
        ["core", "kueue"],
        "core",
        help="Who admits requests. core: the gateway's own admission core (one machine, or "
        "a cluster without Kueue). kueue: the cluster's Kueue decides and the gateway "
        "follows its Workloads (kubeconfig, or the in-cluster config), showing every "
        "Workload of the watched namespaces as a request, with Kueue's positions and "
        "reasons; submissions and cancellations through the API are refused (docs/KUEUE.md).",
    ).tag(config=True)

    kueue_namespace = Unicode(
        help="With --admission kueue: the namespace whose Workloads the gateway follows "
        "(where the users' pods and Jobs run). Empty: every namespace. Default: the "
        "gateway's own namespace in a cluster, else every namespace.",
    ).tag(config=True)

    @default("kueue_namespace")
    def _kueue_namespace_default(self) -> str:
        return own_namespace(otherwise="")

    kueue_interval = Float(
        2.0,
        min=0.1,
        help="With --admission kueue: seconds between asks of Kueue's visibility API for "
        "the positions of pending Workloads (also asked after every change).",
    ).tag(config=True)

    kueue_intent_timeout = Float(
        120.0,
        min=1.0,
        help="With --admission kueue: seconds a holder's request waits for the Workload of "
        "its pod (labelled with the request's id) before it is cancelled.",
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


if __name__ == "__main__":
    sys.exit(main())
