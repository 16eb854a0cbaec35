"""The gateway as the tests start it, one way for every test directory, and the gateway
tests' helpers (their fixtures are in tests/gateway/conftest.py).

- `launch_gateway`: a real `jupyter-gpuaas gateway` process on a free loopback port (or a
  given one, for a restart), its quota and token files written, its output in a log, ready
  once it answers; `GatewayProcess` is what it returns (`stop`, `kill`, `call`).
- `start_gateway_app`: the same app in-process (tornado on a loopback port, the app the
  CLI runs), with short intervals; stop it with `await app.stop_server()`.

Both default to the gateway tests' simulated devices, quota file and tokens; other
directories (jobs, server, kubernetes, gpu, faults, hub) pass their own. `db_url` is a
SQLite file in the directory unless given (`fresh_pg_database`: a new database on the
session server of tests/pg.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from helpers import free_port, stop, wait_http
from tornado.httpclient import AsyncHTTPClient

from jupyter_gpuaas.client import GatewayClient

ROOT = Path(__file__).resolve().parents[1]

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


def fresh_pg_database(postgres_url: str, prefix: str = "gw_") -> str:
    """A new empty database on the session's PostgreSQL server (named `prefix` + hex)."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url)
    name = prefix + uuid.uuid4().hex[:12]
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


def write_files(
    tmp_path: Path, quotas: Mapping[str, Any] | str | None = None,
    tokens: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:  # fmt: skip
    """`tmp_path/quotas.yaml` and `tmp_path/tokens.yaml` (the gateway tests' own unless
    given; `quotas` may be the file's text)."""
    q = tmp_path / "quotas.yaml"
    if isinstance(quotas, str):
        q.write_text(quotas)
    else:
        q.write_text(yaml.safe_dump(dict(quotas or QUOTAS), sort_keys=False))
    t = tmp_path / "tokens.yaml"
    t.write_text(yaml.safe_dump(dict(tokens or TOKEN_FILE)))
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
    """A gateway process `launch_gateway` started: its Popen, base URL and log."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    #: The token `call` sends unless told another (an administrator of the token file).
    admin_token: ClassVar[str] = TOKENS["root"]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 10) -> None:
        stop(self.proc, timeout)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """The parsed JSON answer of one call (urllib's HTTPError for a 4xx or 5xx)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"token {token or self.admin_token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def request(self, rid: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", f"api/requests/{rid}")
        return result


#: The gateway module itself (what `jupyter-gpuaas gateway` hands its argv to), so tests
#: do not depend on every other subcommand importing; tests/gateway/test_client.py and the
#: jobs tests run the real console script (`command=CONSOLE`).
MODULE = (sys.executable, "-m", "jupyter_gpuaas.gateway.app")
CONSOLE = (str(Path(sys.executable).with_name("jupyter-gpuaas")), "gateway")


def gateway_argv(
    tmp_path: Path, db_url: str | None, port: int, *extra: str,
    quotas: Mapping[str, Any] | str | None = None,
    tokens: Mapping[str, Any] | Literal[False] | None = None,
    devices: str = DEVICES, command: Sequence[str] = MODULE,
) -> list[str]:  # fmt: skip
    """The command line of a gateway on 127.0.0.1:`port` (its files written first);
    `tokens=False`: no token file (a gateway that asks the Hub about every token)."""
    q, t = write_files(tmp_path, quotas, tokens or None)
    db_url = db_url or f"sqlite:///{tmp_path / 'gpuaas.sqlite'}"
    return [
        *command,
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--quotas={q}",
        *([f"--tokens={t}"] if tokens is not False else []),
        f"--devices={devices}",
        f"--db-url={db_url}",
        *extra,
    ]


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    """The gateway at `url` answers (helpers.wait_http on its OpenAPI document)."""
    wait_http(url + "api/openapi.json", proc, log, timeout, interval=0.05)


def gateway_env(drop: Sequence[str] = ("JUPYTERHUB_",), **extra: str) -> dict[str, str]:
    """This environment without the variables named by a prefix in `drop` (by default the
    Hub's: a gateway outside any Hub), unbuffered, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def launch_gateway(
    tmp_path: Path,
    db_url: str | None = None,
    *extra: str,
    port: int | None = None,
    quotas: Mapping[str, Any] | str | None = None,
    tokens: Mapping[str, Any] | Literal[False] | None = None,
    devices: str = DEVICES,
    command: Sequence[str] = MODULE,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    wait: bool = True,
    timeout: float = 30,
    context: Any = None,
    new_session: bool = False,
    base_url: str = "/",
    kind: type[GatewayProcess] = GatewayProcess,
) -> GatewayProcess:
    """A real `jupyter-gpuaas gateway` process on `port` (a free loopback port unless
    given), with its quota and token files in `tmp_path` (`tokens=False`: none) and its
    output in `log` (`tmp_path/gateway-N.log` unless given); ready (it answers) unless
    `wait` is False.

    `env`: its whole environment (`gateway_env()`: this one outside any Hub); `context`:
    the TLS context that checks an https gateway; `new_session`: its own process group;
    `base_url`: its prefix (the URL returned includes it); `kind`: a subclass of
    GatewayProcess to return (another admin token, more calls)."""
    port = port or free_port()
    if log is None:
        log = tmp_path / f"gateway-{len(list(tmp_path.glob('gateway-*.log')))}.log"
    if base_url != "/":
        extra = (f"--base-url={base_url}", *extra)
    argv = gateway_argv(
        tmp_path, db_url, port, *extra, quotas=quotas, tokens=tokens, devices=devices,
        command=command,
    )  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else gateway_env(),
            cwd=tmp_path,
            start_new_session=new_session,
        )
    scheme = "https" if context is not None else "http"
    gp = kind(proc, f"{scheme}://127.0.0.1:{port}{base_url}", log)
    if wait:
        wait_http(gp.url + "api/openapi.json", proc, log, timeout, interval=0.05, context=context)
    return gp


async def start_gateway_app(
    tmp_path: Path,
    db_url: str | None = None,
    *,
    quotas: Mapping[str, Any] | str | None = None,
    tokens: Mapping[str, Any] | None = None,
    devices: str = DEVICES,
    **traits: Any,
) -> Any:
    """The real gateway (GatewayApp) in-process on a free loopback port, with short
    keepalive, tick and sample intervals unless `traits` say otherwise; `app.url` is its
    base URL. Stop it with `await app.stop_server()`."""
    from jupyter_gpuaas.gateway.app import GatewayApp

    q, t = write_files(tmp_path, quotas, tokens)
    kw: dict[str, Any] = {
        "ip": "127.0.0.1",
        "port": 0,
        "quotas": str(q),
        "tokens": str(t),
        "devices": devices,
        "db_url": db_url or f"sqlite:///{tmp_path / 'gpuaas.sqlite'}",
        "keepalive_interval": 0.3,
        "tick_interval": 0.1,
        "sample_interval": 0.5,
        "hub_service": False,
        **traits,
    }
    app = GatewayApp(**kw)
    port = await app.start_server()
    app.url = f"http://127.0.0.1:{port}{app.base_url}"
    return app


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
