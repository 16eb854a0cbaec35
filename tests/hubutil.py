"""A REAL JupyterHub for the hub tests: `jupyterhub -f <generated config>` as a subprocess.

Every test that needs a Hub (tests/hub/, tests/ui/) starts it here: `Hub(root, extra_config)`
then `with hub.running():` (the session's shared hub is tests/conftest.py's `hub` fixture;
`module_hub` gives a module a Hub of its own).
The generated config loads the demo's own hub_config/local/jupyterhub_config.py (so these
tests run the embedded default), on free loopback ports for the hub, the proxy's API and
the gateway, with configurable-http-proxy from node_modules/ and the gateway as the
Hub-managed service on simulated devices. It adds a `tester` service whose API token
administers users and servers, shortens the spawner's heartbeat and activity window, and
uses a quota file where `nlp` servers are culled after 10 idle seconds.

One hub serves the whole session of tests/hub/ and tests/ui/ (JupyterHub starts slowly on a small
machine); each test leaves no server running behind it (`hub.cleanup()`). Tests that need a
differently configured hub start their own. Tests import `Hub`, `REPO` and the rest from
here (`hubutil`, a unique name beside helpers.py: `conftest` is ambiguous when several test
directories run together).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import requests
from helpers import free_port, stop, wait_for

REPO = Path(__file__).resolve().parents[1]
CHP = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
USERS = ("alice", "bob", "carol")

# One node of four (simulated) a100s. vision may hold 3, nlp 1; no cohort, so nobody
# borrows and the queue is easy to reason about. nlp is culled when idle 10 s and keeps
# its quota parked for 120 s. (Not less: a single-user server reports idle as soon as it
# runs, and under load the Hub's spawn request waits several more seconds for it to
# answer; a cull in between cancels the spawn and the Hub answers 500.)
QUOTAS = """\
flavors:
  a100: {nodes: 1, gpus_per_node: 4}
tenants:
  vision:
    quota: {a100: 3}
  nlp:
    quota: {a100: 1}
    idle_timeout: 10
    reservation_ttl: 120
policy:
  idle_timeout: 0
  reservation_ttl: 0
"""

EXTRA_CONFIG = """
c = get_config()  # noqa: F821
load_subconfig({demo_config!r})  # noqa: F821

c.JupyterHub.services.append({{"name": "tester", "api_token": {token!r}}})
c.JupyterHub.load_roles.append(
    {{
        "name": "tester",
        "scopes": ["admin:users", "admin:servers", "admin:server_state", "read:hub",
                   "custom:gpuaas:view", "access:services!service=gpuaas"],
        "services": ["tester"],
    }}
)
c.JupyterHub.log_level = "DEBUG"
c.QueuedSpawnerMixin.max_gpus = 8
c.QueuedSpawnerMixin.heartbeat_interval = 1.0
c.QueuedSpawnerMixin.activity_window = 1.0
# Servers judge and report their own activity (server/idle.py) every second here too.
c.Spawner.args.append("--GpuaasExtension.heartbeat_interval=1")
c.Spawner.start_timeout = 60
c.Spawner.poll_interval = 2
c.Spawner.http_timeout = 60
"""


async def execute_until_busy(
    ws_url: str, token: str, code: str, user: str = "alice", timeout: float = 30
) -> None:
    """Send one execute_request of `code` on a kernel's websocket behind the Hub (`ws_url`,
    `token`: the server's), as JupyterLab would for `user`; return once the kernel says it
    is busy, leaving it computing."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": user,
              "session": uuid.uuid4().hex, "date": "", "version": "5.3"}  # fmt: skip
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}  # fmt: skip
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content,
               "channel": "shell", "buffers": []}  # fmt: skip
    conn.write_message(json.dumps(message))
    while True:
        raw = await asyncio.wait_for(conn.read_message(), timeout)
        assert raw is not None, "the kernel's websocket closed"
        msg = json.loads(raw)
        if msg.get("msg_type") == "status" and msg["content"]["execution_state"] == "busy":
            break
    conn.close()


def module_hub(extra_config: str) -> Any:
    """A module-scoped fixture: one Hub of its own (`Hub(root, extra_config)`) for a module
    whose tests need another configuration than the session's (a start costs seconds);
    each of its tests ends with every server stopped, as it began. Used as
    `own_hub = module_hub(EXTRA)` in the test module."""
    import pytest

    @pytest.fixture(scope="module")
    def own_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
        with Hub(tmp_path_factory.mktemp("own-hub"), extra_config).running() as hub:
            yield hub

    return own_hub


def need_proxy() -> None:
    """Skip the test, saying why, where configurable-http-proxy is not installed."""
    import pytest

    if not CHP.exists() and not shutil.which("configurable-http-proxy"):
        pytest.skip("configurable-http-proxy not installed: run `npm ci` (make test does)")


def log_in(page: Any, url: str, user: str, password: str, next_path: str = "") -> None:
    """Log `user` in on a browser `page` with the login form of the Hub at `url`; the Hub
    then sends it to `next_path` (URL-encoded), or to its default (the spawn form)."""
    page.goto(f"{url}/hub/login" + (f"?next={next_path}" if next_path else ""))
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("input[type=submit], button[type=submit]")


class Hub:
    """The running hub, and what the tests do with it."""

    def __init__(self, root: Path, extra_config: str = "", *, quotas: str = QUOTAS) -> None:
        self.root = root
        self.extra_config = extra_config  # appended to the generated config
        self.quotas = quotas  # the gateway's quota file
        self.port = free_port()
        self.gateway_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = f"{self.url}/hub/api"
        self.token = secrets.token_hex(32)
        self.hub_token = secrets.token_hex(32)
        self.password = "gpuaas-test-pw"
        self.admin_password = secrets.token_urlsafe(32)  # user `admin` (the demo's admin)
        self.gateway = f"http://127.0.0.1:{self.gateway_port}/services/gpuaas/api"
        self.log_path = root / "jupyterhub.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._server_pids: list[int] = []  # killed at the end of running()

    @contextlib.contextmanager
    def running(self) -> Iterator[Hub]:
        """Start the hub (skipping the test where configurable-http-proxy is missing) and,
        at the end, stop every server still running (`cleanup`), the hub itself, and kill
        every server process named to `remember_pid` (a hub with `cleanup_servers = False`
        leaves them running)."""
        need_proxy()
        started = False
        try:
            self.start()
            started = True
            yield self
        finally:
            try:
                if started and self.proc is not None and self.proc.poll() is None:
                    self.cleanup()
            finally:
                self.stop()
                for pid in self._server_pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def remember_pid(self, pid: int) -> None:
        """A single-user server to kill at the end of `running()`, whatever happens."""
        self._server_pids.append(pid)

    # --- process ---------------------------------------------------------------------

    def start(self) -> None:
        (self.root / "quotas.yaml").write_text(self.quotas)
        config = self.root / "jupyterhub_config.py"
        demo_config = str(REPO / "hub_config" / "local" / "jupyterhub_config.py")
        text = EXTRA_CONFIG.format(demo_config=demo_config, token=self.token)
        config.write_text(text + self.extra_config)
        env = dict(os.environ)
        env.update(
            GPUAAS_DEMO_IP="127.0.0.1",
            GPUAAS_DEMO_PORT=str(self.port),
            GPUAAS_DEMO_HUB_PORT=str(free_port()),
            GPUAAS_DEMO_PROXY_API_PORT=str(free_port()),
            GPUAAS_DEMO_GATEWAY_PORT=str(self.gateway_port),
            GPUAAS_DEMO_PASSWORD=self.password,
            GPUAAS_DEMO_ADMIN_PASSWORD=self.admin_password,
            GPUAAS_DEMO_DEVICES="simulated:a100=1x4",
            GPUAAS_DEMO_QUOTAS=str(self.root / "quotas.yaml"),
            GPUAAS_DEMO_STATE_DIR=str(self.root / "state"),
            GPUAAS_HUB_TOKEN=self.hub_token,
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        )
        env.pop("GPUAAS_URL", None)
        jupyterhub = str(Path(sys.executable).with_name("jupyterhub"))
        log = open(self.log_path, "wb")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            [jupyterhub, "-f", str(config)],
            cwd=self.root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited ({proc.returncode}):\n{self.log()}")
            try:
                return (
                    self.get("/").status_code == 200
                    and requests.get(f"{self.gateway}/devices", headers=self._gw, timeout=2).ok
                )
            except requests.RequestException:
                return False

        wait_for(up, 90, "jupyterhub and its gateway to answer", interval=0.3, detail=self.log)

    def stop(self) -> None:
        stop(self.proc, 30, group=True)

    def gateway_pid(self) -> int | None:
        """The process id of the Hub-managed gateway (None while there is none)."""
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if "jupyter_gpuaas.cli" in cmd and "gateway" in cmd:
                return int(child.pid)
        return None

    def log(self, tail: int = 6000) -> str:
        """The last `tail` characters of the Hub's log, less the lines of the tests' own
        polling (a wait of 30 s polls /hub/api/users 150 times: two lines each, which
        would fill the tail and hide what the Hub did meanwhile)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        polled = ("Checking access to /hub/api/users/", "200 GET /hub/api/users/")
        kept = [line for line in text.splitlines() if not any(p in line for p in polled)]
        return "\n".join(kept)[-tail:]

    def log_in(self, page: Any, user: str, next_path: str = "") -> None:
        """`log_in` to this hub with the shared password."""
        log_in(page, self.url, user, self.password, next_path)

    # --- Hub REST API ----------------------------------------------------------------

    @property
    def _h(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    @property
    def _gw(self) -> dict[str, str]:
        return {"Authorization": f"token {self.hub_token}"}

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.api + path, headers=self._h, timeout=30, **kw)

    def spawn(self, user: str, options: dict[str, Any] | None = None) -> requests.Response:
        """POST /users/{user}/server: 201 started, 202 pending, or the refusal."""
        return requests.post(
            f"{self.api}/users/{user}/server", headers=self._h, json=options or {}, timeout=60
        )

    def stop_server(self, user: str) -> requests.Response:
        return requests.delete(f"{self.api}/users/{user}/server", headers=self._h, timeout=60)

    def server(self, user: str) -> dict[str, Any] | None:
        model = self.get(f"/users/{user}").json()
        return (model.get("servers") or {}).get("")

    def wait_for(self, what: Callable[[], Any], timeout: float = 30, why: str = "") -> Any:
        return wait_for(what, timeout, why, interval=0.2, detail=self.log)

    def wait_ready(self, user: str, timeout: float = 60) -> dict[str, Any]:
        def ready() -> Any:
            s = self.server(user)
            return s if s and s.get("ready") else None

        return self.wait_for(ready, timeout, f"{user}'s server to be ready")  # type: ignore[no-any-return]

    def wait_stopped(self, user: str, timeout: float = 30) -> None:
        self.wait_for(lambda: self.server(user) is None, timeout, f"{user}'s server to stop")

    def progress(
        self, user: str, until: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> list[dict[str, Any]]:
        """Progress events of a pending spawn (SSE) until one satisfies `until`."""
        events: list[dict[str, Any]] = []
        with requests.get(
            f"{self.api}/users/{user}/server/progress",
            headers=self._h,
            stream=True,
            timeout=(5, timeout),
        ) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                events.append(event)
                if until(event) or event.get("failed") or event.get("ready"):
                    break
        return events

    def pid(self, user: str) -> int:
        server = self.server(user)
        assert server is not None
        return int(server["state"]["pid"])

    def environ(self, user: str) -> dict[str, str]:
        """The real environment of the user's server process (/proc/PID/environ)."""
        raw = Path(f"/proc/{self.pid(user)}/environ").read_bytes()
        pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        return {k.decode(): v.decode(errors="replace") for k, v in pairs}

    # --- the gateway, as the Hub's watcher token sees it ------------------------------

    def requests_of(self, user: str) -> list[dict[str, Any]]:
        resp = requests.get(
            f"{self.gateway}/requests", params={"user": user}, headers=self._gw, timeout=10
        )
        resp.raise_for_status()
        return resp.json()  # type: ignore[no-any-return]

    def tenant(self, name: str) -> dict[str, Any]:
        data = requests.get(f"{self.gateway}/tenants", headers=self._gw, timeout=10).json()
        return next(t for t in data["tenants"] if t["name"] == name)

    def cleanup(self) -> None:
        """Stop every server (and pending spawn) so the next test starts from empty.
        A stop may take the spawner's SIGINT, SIGTERM and SIGKILL waits (JupyterHub's
        defaults: 30 + 30 + 5 s) and the gateway release's 30 s bound (client.py), so
        each user gets 100 s: a server JupyterLab was open in outlived the 30 s of
        `wait_stopped` once under a fresh-clone run's load."""
        for user in USERS:
            if self.server(user) is not None:
                self.stop_server(user)
        for user in USERS:
            self.wait_stopped(user, timeout=100)
