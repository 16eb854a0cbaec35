"""Fixtures of the Kubernetes tests.

`k8s`: the in-process Kubernetes API DOUBLE of k8s_double.py (no API server can run on
these machines), with a kubeconfig pointing at it. `gateway`: the real gateway app
in-process on a loopback port (simulated devices named like the double's Nodes, a token
file). `make_spawner`: the real QueuedKubeSpawner (a KubeSpawner subclass) with a stand-in
for the Hub's user object, talking to both over real HTTP.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from k8s_double import KubernetesDouble
from kubefix import DEVICES, FLAVORS, QUOTAS, TOKEN_FILE, HubUser


@pytest_asyncio.fixture
async def k8s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubernetesDouble]:
    double = KubernetesDouble()
    await double.start()
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(double.kubeconfig()))
    monkeypatch.setenv("KUBECONFIG", str(config))
    # kubernetes_asyncio reads $KUBECONFIG once, when first imported.
    from kubernetes_asyncio.config import kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield double
    finally:
        try:
            from kubespawner import KubeSpawner

            await KubeSpawner._stop_all_reflectors()
        except ImportError:
            pass
        await double.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store: SQLite, or a fresh database on the session's PostgreSQL (tests/pg.py),
    the store of the cluster mode (the manifests take its URL from a Secret)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpuaas.sqlite'}"
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(request.getfixturevalue("postgres_url"))
    name = "k8s_" + uuid.uuid4().hex[:12]
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Any]:
    from jupyter_gpuaas.gateway.app import GatewayApp

    q = tmp_path / "quotas.yaml"
    q.write_text(yaml.safe_dump(QUOTAS))
    t = tmp_path / "tokens.yaml"
    t.write_text(yaml.safe_dump(TOKEN_FILE))
    app = GatewayApp(
        ip="127.0.0.1",
        port=0,
        quotas=str(q),
        tokens=str(t),
        devices=DEVICES,
        db_url=f"sqlite:///{tmp_path / 'gpuaas.sqlite'}",
        keepalive_interval=0.3,
        tick_interval=0.1,
        sample_interval=0.5,
        hub_service=False,
    )
    port = await app.start_server()
    app.url = f"http://127.0.0.1:{port}{app.base_url}"
    try:
        yield app
    finally:
        await app.stop_server()


@pytest.fixture
def make_spawner(k8s: KubernetesDouble, gateway: Any) -> Callable[..., Any]:
    from jupyterhub.objects import Hub

    from jupyter_gpuaas.hub.kube import QueuedKubeSpawner

    def make(user: str = "alice", **traits: Any) -> Any:
        hub = Hub(ip="127.0.0.1", port=8081, base_url="/hub/")
        hub_user = HubUser(user, ["vision"])
        kw: dict[str, Any] = dict(
            user=hub_user,
            orm_spawner=hub_user.orm_spawner(),
            hub=hub,
            namespace="jhub",
            k8s_api_host=k8s.url,
            gateway_url=gateway.url,
            flavors=FLAVORS,
            image="quay.io/jupyter/base-notebook:2026-11",
            cmd=["jupyterhub-singleuser"],
            node_selector={"team": "ml"},
            tolerations=[{"key": "spot", "operator": "Exists"}],
            extra_resource_limits={"ephemeral-storage": "10Gi"},
            start_timeout=20,
            refresh_interval=0.5,
            heartbeat_interval=0.5,
            api_token="hub-token-for-the-server",
        )
        kw.update(traits)
        return QueuedKubeSpawner(**kw)

    return make
