"""The demo command itself, as a newcomer runs it: `jupyter-gpuaas demo --port P --state-dir D`.

Each `DemoRun` is one real `.venv/bin/jupyter-gpuaas demo` process (which starts JupyterHub,
configurable-http-proxy, the gateway and the user servers), started from an empty working
directory so the demo has to find its shipped config by itself. Users log in with the
shared password like a browser does, and get a Hub API token of their own for the REST
calls (spawning, reading the gateway through the proxy).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import requests
from helpers import free_port, wait_for

DEMO = Path(sys.executable).with_name("jupyter-gpuaas")
PASSWORD = "gpuaas-test-pw"


def port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port (as the demo's own check: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class DemoRun:
    def __init__(
        self,
        root: Path,
        *extra: str,
        name: str = "demo",
        prefix: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.prefix = prefix or [str(DEMO)]  # how to run `jupyter-gpuaas`
        self.env = env or {}  # on top of ours
        self.root = root
        self.cwd = root / f"{name}-cwd"  # empty: nothing to find the config by
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.state = root / f"{name}-state"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = list(extra)
        self.log_path = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.tokens: dict[str, str] = {}

    @property
    def cmd(self) -> list[str]:
        return [
            *self.prefix,
            "demo",
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state),
            "--password",
            PASSWORD,
            *self.extra,
        ]

    def start(self, timeout: float = 120) -> None:
        env = dict(os.environ)
        env.pop("GPUAAS_URL", None)
        # The venv's bin on PATH, as an activated venv or `make demo` has it.
        env["PATH"] = f"{DEMO.parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(self.env)
        log = open(self.log_path, "wb")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # like a terminal's job: our signals are our own
        )
        proc = self.proc

        def banner() -> bool:
            if "jupyter-gpuaas demo hub:" in self.log():
                return True
            if proc.poll() is not None:
                raise RuntimeError(f"the demo exited ({proc.returncode}):\n{self.log()}")
            return False

        wait_for(banner, timeout, "the demo's banner", interval=0.2, detail=self.log)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def admin_password(self) -> str:
        m = re.search(r"admin\s+\(password (\S+)\)", self.log())
        assert m, self.log()
        return m.group(1)

    # --- processes -------------------------------------------------------------------

    def descendants(self) -> list[psutil.Process]:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).children(recursive=True)

    def listening_ports(self) -> set[int]:
        ports = set()
        for p in [psutil.Process(self.proc.pid), *self.descendants()]:  # type: ignore[union-attr]
            try:
                conns = p.net_connections(kind="inet")
            except psutil.Error:
                continue
            ports |= {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
        return ports

    def signal(self, sig: int = signal.SIGTERM, timeout: float = 90) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill_all(self) -> None:
        """Last resort for a failed test: SIGTERM, then SIGKILL of what is left."""
        if self.proc is None:
            return
        left = []
        try:
            left = self.descendants()
        except psutil.Error:
            pass
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGTERM, timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass

    # --- as a user -------------------------------------------------------------------

    def login(self, user: str, password: str = PASSWORD) -> requests.Session:
        """A browser-like session: the login form with its _xsrf cookie."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=30).raise_for_status()
        xsrf = s.cookies.get("_xsrf", path="/hub/")
        resp = s.post(
            f"{self.url}/hub/login",
            data={"username": user, "password": password, "_xsrf": xsrf},
            timeout=30,
            allow_redirects=False,
        )
        assert resp.status_code == 302, (resp.status_code, resp.text[:500])
        # The login starts a new session, and with it a new xsrf token (in its cookie).
        s.headers["X-XSRFToken"] = s.cookies.get("_xsrf", path="/hub/") or ""
        return s

    def token(self, user: str) -> str:
        """A Hub API token of the user's own (her roles: the gateway's custom scopes)."""
        if user not in self.tokens:
            s = self.login(user, self.admin_password() if user == "admin" else PASSWORD)
            resp = s.post(
                f"{self.url}/hub/api/users/{user}/tokens",
                json={"note": "demo test", "expires_in": 3600},
                timeout=30,
            )
            assert resp.status_code == 201, resp.text
            self.tokens[user] = resp.json()["token"]
        return self.tokens[user]

    def api(self, user: str, method: str, path: str, **kw: Any) -> requests.Response:
        """The Hub's REST API as the user (path below /hub/api)."""
        headers = {"Authorization": f"token {self.token(user)}"}
        return requests.request(
            method, f"{self.url}/hub/api{path}", headers=headers, timeout=60, **kw
        )

    def gateway(self, user: str, path: str) -> Any:
        """The gateway through the public proxy, as the user (path below api/)."""
        headers = {"Authorization": f"token {self.token(user)}"}
        resp = requests.get(f"{self.url}/services/gpuaas/api/{path}", headers=headers, timeout=30)
        resp.raise_for_status()
        return resp.json()

    def server(self, user: str) -> dict[str, Any] | None:
        model = self.api(user, "GET", f"/users/{user}").json()
        return (model.get("servers") or {}).get("")

    def wait_ready(self, user: str, timeout: float = 90) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            s = self.server(user)
            return s if s and s.get("ready") else None

        return wait_for(  # type: ignore[no-any-return]
            ready, timeout, f"{user}'s server to be ready", interval=0.3,
            detail=lambda: self.log()[-6000:],
        )  # fmt: skip
