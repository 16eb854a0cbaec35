"""Helpers of the gateway tests (the fixtures are in conftest.py).

`make_gateway` starts the gateway in-process (tornado on a loopback port, the same app the
CLI runs) with simulated devices, a temp quota file and token file; `spawn_gateway` starts
`jupyter-gpuaas gateway` as a subprocess (restart and kill -9 tests). `db_url` is
parametrized over SQLite and PostgreSQL (a fresh database per test on the session server
of tests/pg.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from helpers import free_port, stop, wait_http
from tornado.httpclient import AsyncHTTPClient

from jupyter_gpuaas.client import GatewayClient

ROOT = Path(__file__).resolve().parents[2]

TOKENS = {
    "alice": "alice-token-0001",  # vision member
    "bob": "bob-token-00002",  # nlp member
    "carol": "carol-token-003",  # vision member with view
    "root": "root-token-0004",  # admin
    "eve": "eve-token-000005",  # no tenant group
}
TOKEN_FILE = {
    "tokens": {
        TOKENS["alice"]: {"user": "alice", "groups": ["vision"]},
        TOKENS["bob"]: {"user": "bob", "groups": ["nlp"]},
        TOKENS["carol"]: {"user": "carol", "groups": ["vision"], "view": True},
        TOKENS["root"]: {"user": "root", "admin": True},
        TOKENS["eve"]: {"user": "eve", "groups": []},
    }
}
QUOTAS: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}, "t4": {"nodes": 1, "gpus_per_node": 8}},
    "tenants": {
        "vision": {"cohort": "research", "quota": {"a100": 4, "t4": 0}},
        "nlp": {"cohort": "research", "quota": {"a100": 2}, "borrowing_limit": {"a100": 0}},
    },
}
DEVICES = "simulated:a100=1x4,t4=1x8"


def fresh_pg_database(postgres_url: str) -> str:
    """A new empty database on the session's PostgreSQL server."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url)
    name = "gw_" + uuid.uuid4().hex[:12]
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


def write_files(tmp_path: Path, quotas: dict[str, Any] | None = None) -> tuple[Path, Path]:
    q = tmp_path / "quotas.yaml"
    q.write_text(yaml.safe_dump(quotas or QUOTAS, sort_keys=False))
    t = tmp_path / "tokens.yaml"
    t.write_text(yaml.safe_dump(TOKEN_FILE))
    return q, t


@dataclass
class Gateway:
    app: Any
    url: str

    def client(self, who: str) -> GatewayClient:
        return GatewayClient(self.url, TOKENS.get(who, who))

    async def raw(
        self, method: str, path: str, body: Any = None, who: str | None = "alice", **headers: str
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text) of one call; `who=None`: no Authorization."""
        hdrs = dict(headers)
        if who is not None:
            hdrs.setdefault("Authorization", f"token {TOKENS.get(who, who)}")
        if body is not None and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
        if body:  # what every client of ours sends (a body without it is a 415)
            hdrs.setdefault("Content-Type", "application/json")
        if body is None and method in ("POST", "PUT"):
            body = ""
        resp = await AsyncHTTPClient().fetch(
            self.url + path.lstrip("/"),
            method=method,
            body=body,
            headers=hdrs,
            raise_error=False,
            allow_nonstandard_methods=True,
        )
        text = resp.body.decode() if resp.body else ""
        try:
            return resp.code, json.loads(text)
        except ValueError:
            return resp.code, text

    @property
    def arbiter(self) -> Any:
        return self.app.arbiter


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        stop(self.proc, 10)


def gateway_argv(
    tmp_path: Path, db_url: str, port: int, *extra: str, quotas: dict[str, Any] | None = None
) -> list[str]:
    q, t = write_files(tmp_path, quotas)
    # The gateway module itself (what `jupyter-gpuaas gateway` hands its argv to), so
    # these tests do not depend on every other subcommand importing; test_client.py runs
    # the real console script.
    head = [sys.executable, "-m", "jupyter_gpuaas.gateway.app"]
    return [
        *head,
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--quotas={q}",
        f"--tokens={t}",
        f"--devices={DEVICES}",
        f"--db-url={db_url}",
        *extra,
    ]


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    """The gateway at `url` answers (helpers.wait_http on its OpenAPI document)."""
    wait_http(url + "api/openapi.json", proc, log, timeout)


def launch_gateway(
    tmp_path: Path, db_url: str, *extra: str, port: int | None = None, **kw: Any
) -> GatewayProcess:
    """A real `jupyter-gpuaas gateway` process on a free loopback port, ready; its output
    in `tmp_path/gateway-N.log`. Outside any Hub: the Hub's variables are left out."""
    port = port or free_port()
    n = len(list(tmp_path.glob("gateway-*.log")))
    log = tmp_path / f"gateway-{n}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for k in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_NAME"):
        env.pop(k, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            gateway_argv(tmp_path, db_url, port, *extra, **kw),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    gp = GatewayProcess(proc, f"http://127.0.0.1:{port}/", log)
    wait_ready(gp.url, proc, log)
    return gp


# --- raw calls and the store-is-the-truth checks (test_store_faults.py) ------------------


def call(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    who: str | None = "alice",
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON or text, headers) of one blocking call; status 0: no answer."""
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers or {})
    if data and not req.has_header("Content-type"):
        req.add_header("Content-Type", "application/json")
    if who is not None:
        req.add_header("Authorization", f"token {TOKENS.get(who, who)}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, headers = resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        status, raw, headers = e.code, e.read(), dict(e.headers)
    except OSError:
        return 0, None, {}
    try:
        return status, json.loads(raw), headers
    except ValueError:
        return status, raw.decode(errors="replace"), headers


def store_rows(db_url: str) -> dict[str, Any]:
    """Every request row of the store, by id (read with a separate engine)."""
    from jupyter_gpuaas.gateway.store import Store, make_engine

    store = Store(make_engine(db_url))
    try:
        return {r.id: r for r in store.query(limit=1_000_000)}
    finally:
        store.close()


def assert_memory_is_store(
    url: str, db_url: str, accepted: set[str], refused_names: set[str] | None = None
) -> dict[str, Any]:
    """The gateway's memory (what it lists and who holds devices) equals the store.

    Every id answered 201 is stored; no request named in `refused_names` (answered
    4xx other than 422, or 5xx) is; every held device is held by a request anyone with
    view can list, and the store says the same holder. Returns the stored rows.
    """
    status, listed, _ = call(url, "GET", "api/requests?limit=10000", who="root")
    assert status == 200, listed
    rows = store_rows(db_url)
    missing = accepted - set(rows)
    assert not missing, (
        f"{len(missing)} requests answered 201 are not stored: {sorted(missing)[:3]}"
    )
    leaked = {r.name for r in rows.values()} & (refused_names or set())
    assert not leaked, f"requests answered with an error are stored: {sorted(leaked)[:3]}"
    assert {r["id"] for r in listed} == set(rows)
    for r in listed:
        assert rows[r["id"]].state == r["state"], (r, rows[r["id"]].state)
    status, devices, _ = call(url, "GET", "api/devices", who="root")
    assert status == 200, devices
    held = {(d["node"], d["index"]): d["holder"]["id"] for d in devices["devices"] if d["holder"]}
    stored: dict[tuple[str, int], str] = {}
    for row in rows.values():
        if row.state == "admitted":
            for index in row.device_list():
                assert (row.node, index) not in stored, f"device {row.node}/{index} held twice"
                stored[(row.node or "", index)] = row.id
    assert held == stored, "the devices the gateway says are held are not the store's"
    listed_ids = {r["id"] for r in listed if r["state"] == "admitted"}
    assert set(held.values()) <= listed_ids, "a device is held by a request nobody can list"
    return rows
