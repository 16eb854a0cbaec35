"""The demo's process supervision: start JupyterHub, say when it answers, stop it all.

JupyterHub starts the proxy, the gateway (a managed service) and the user servers, each in
a session of its own. Its own cleanup stops the managed services *before* the user
servers (JupyterHub.cleanup), so a server's stop could no longer hand its GPUs back and a
restarted gateway would restore phantom holders until their leases expire. The demo
therefore stops in this order:

1. every user server and pending spawn through the Hub's REST API (each spawner's stop
   releases its grant through the still-running gateway), waiting until none is active;
2. the Hub (SIGTERM: its cleanup stops the gateway and the proxy);
3. whatever is left of the processes it started: the demo is their child subreaper
   (Linux), so orphans come back to it to be terminated and reaped, and it also remembers
   every descendant it has seen, for systems without subreapers.

The Hub runs in a process group of its own so that Ctrl-C in the terminal reaches only
the demo, which then stops things in that order; the Hub gets SIGTERM if the demo dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _hub_preexec() -> None:
    # In the child, before exec: the Hub gets SIGTERM (and cleans up) if the demo dies,
    # even by SIGKILL.
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    """Runs one Hub command until it exits or the demo is told to stop."""

    def __init__(
        self,
        cmd: list[str],
        env: dict[str, str],
        cwd: str,
        url: str,
        control_token: str | None,
        banner: Callable[[], str],
        hub_api: str | None = None,
        proxy_routes: tuple[str, str] | None = None,
        ready_timeout: float = 180.0,
    ) -> None:
        self.cmd = cmd
        self.env = env
        self.cwd = cwd
        self.url = url  # the public URL as the demo reaches it, ending in /
        self.control_token = control_token
        self.hub_api = hub_api  # the Hub's API on its own port, ending in /
        self.proxy_routes = proxy_routes  # the proxy's routes API and its token
        self.banner = banner
        self.ready_timeout = ready_timeout
        self.hub: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.hurry = False  # a second Ctrl-C: skip the polite steps
        self.seen: dict[int, psutil.Process] = {}

    # --- signals ---------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stopping:
            self.hurry = True
        self.stopping = True

    def _install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    # --- the run ---------------------------------------------------------------------

    def run(self) -> int:
        self._install_signals()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.hub = subprocess.Popen(
            self.cmd,
            cwd=self.cwd,
            env=self.env,
            start_new_session=True,  # the terminal's Ctrl-C is for the demo alone
            preexec_fn=_hub_preexec if sys.platform.startswith("linux") else None,
        )
        if not self._wait_ready():
            if self.stopping:
                self.shutdown()
                return 0
            code = self.hub.poll()
            if code is None:
                print(
                    f"demo: the hub did not answer at {self.url} within "
                    f"{self.ready_timeout:.0f} s; stopping it",
                    file=sys.stderr,
                    flush=True,
                )
                self.shutdown()
                return 1
            print(f"demo: the hub exited with status {code} before it answered", flush=True)
            self._kill_leftovers()
            return code or 1
        print(self.banner(), flush=True)
        last_track = 0.0
        while not self.stopping and self.hub.poll() is None:
            if time.monotonic() - last_track > 2:  # a walk of the whole process table
                self._track()
                self._reap_orphans()
                last_track = time.monotonic()
            time.sleep(0.2)
        if not self.stopping:
            code = self.hub.returncode
            print(f"demo: the hub exited with status {code}", flush=True)
            self._kill_leftovers()
            return code
        self.shutdown()
        return 0

    def _wait_ready(self) -> bool:
        """True once the Hub answers through the proxy and the gateway through the Hub's
        route to it; False if the Hub exits, the demo is stopped or time runs out."""
        import requests

        # The Hub's own port first, which logs nothing while it is not up yet; then the
        # proxy's route table, until the Hub's route is in: the Hub answers on its port
        # before it adds that route, and each miss at the public URL meanwhile is a red
        # "[ConfigProxy] error: 404" in the demo's log. Then the public URL, then the
        # gateway.
        checks = [f"{self.url}hub/api/", f"{self.url}services/gpuaas/api/openapi.json"]
        if self.proxy_routes:
            checks.insert(0, self.proxy_routes[0])
        if self.hub_api:
            checks.insert(0, self.hub_api)
        deadline = time.monotonic() + self.ready_timeout
        assert self.hub is not None
        while checks and time.monotonic() < deadline and not self.stopping:
            if self.hub.poll() is not None:
                return False
            self._track()
            try:
                if self._answers(checks[0]):
                    checks.pop(0)
                    continue
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.3 if checks[0] == self.hub_api else 1.0)
        return not checks

    def _answers(self, url: str) -> bool:
        """Whether `url` is up: a 200, and for the proxy's routes, the Hub's route ("/")."""
        import requests

        if self.proxy_routes and url == self.proxy_routes[0]:
            headers = {"Authorization": f"token {self.proxy_routes[1]}"}
            resp = requests.get(url, headers=headers, timeout=2)
            return resp.status_code == 200 and "/" in resp.json()
        return bool(requests.get(url, timeout=2).status_code == 200)

    # --- stopping --------------------------------------------------------------------

    def shutdown(self) -> None:
        print(
            "\ndemo: stopping the user servers (their GPUs go back to the gateway), "
            "then the hub, the proxy and the gateway…",
            flush=True,
        )
        assert self.hub is not None
        self._track()
        if self.hub.poll() is None and not self.hurry:
            self.stop_servers()
        if self.hub.poll() is None:
            self.hub.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while self.hub.poll() is None and time.monotonic() < deadline and not self.hurry:
                self._track()
                time.sleep(0.2)
            if self.hub.poll() is None:
                self.hub.kill()
                self.hub.wait()
        self._kill_leftovers()
        print("demo: stopped.", flush=True)

    def stop_servers(self, timeout: float = 60.0) -> None:
        """Stop every user server and pending spawn through the Hub API, and wait."""
        if not self.control_token:
            return  # a --config of the user's own, without the demo's control service
        import requests

        api = f"{self.url}hub/api"
        headers = {"Authorization": f"token {self.control_token}"}

        def active() -> list[dict[str, Any]]:
            resp = requests.get(
                f"{api}/users", params={"state": "active"}, headers=headers, timeout=10
            )
            resp.raise_for_status()
            return list(resp.json())

        deadline = time.monotonic() + timeout
        try:
            users = active()
            for user in users:
                for name in user.get("servers") or {}:
                    path = f"servers/{name}" if name else "server"
                    requests.delete(
                        f"{api}/users/{user['name']}/{path}", headers=headers, timeout=30
                    )
            while users and time.monotonic() < deadline and not self.hurry:
                time.sleep(0.3)
                users = active()
        except (requests.RequestException, ValueError) as e:
            print(f"demo: could not stop the user servers through the hub ({e})", flush=True)

    # --- processes -------------------------------------------------------------------

    def _track(self) -> None:
        """Remember every descendant now alive, to stop those the Hub leaves behind."""
        try:
            for p in psutil.Process().children(recursive=True):
                self.seen.setdefault(p.pid, p)
        except psutil.Error:
            pass

    def _reap_orphans(self) -> None:
        """As subreaper, reap orphans that died (never the Hub: Popen reaps it)."""
        assert self.hub is not None
        for p in psutil.Process().children():
            if p.pid == self.hub.pid:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if p.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(p.pid, os.WNOHANG)

    def _kill_leftovers(self, grace: float = 5.0) -> None:
        self._track()
        alive = []
        for p in self.seen.values():
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # same create_time
                    alive.append(p)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(alive, timeout=grace)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=grace)
        self._reap_orphans_all()

    def _reap_orphans_all(self) -> None:
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process().children():
                with contextlib.suppress(psutil.Error, ChildProcessError):
                    os.waitpid(p.pid, os.WNOHANG)
