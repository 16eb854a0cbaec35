"""Fixtures of the Kubernetes tests.

`k8s`: the in-process Kubernetes API DOUBLE of k8s_double.py (no API server can run on
these machines), with a kubeconfig pointing at it. `gateway`: the real gateway app
in-process on a loopback port (simulated devices named like the double's Nodes, a token
file); `make_cluster_gateway`: the same with the double's Nodes as its inventory and a
scaler (kubeutil.py has the helpers under both). `make_spawner`: the real
QueuedKubeSpawner (a KubeSpawner subclass) with a stand-in for the Hub's user object,
talking to both over real HTTP.

`cluster`: the REAL control plane (issue 39), one for the session: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK's GPU nodes and Kueue, built from the Go
modules pinned in cluster/ and started by scripts/cluster.py through kwokctl (what
`make cluster-up` runs). A test that fails while it is up gets every component's log tail
in its report. The tests still on the double move onto it one file at a time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from k8s_double import KubernetesDouble
from kubefix import DEVICES, FLAVORS, QUOTAS
from kubeutil import POOL_A100, SCALE_QUOTAS, KubeOnCluster, kube_spawner, start_gateway
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[2]


def _cluster_module() -> Any:
    """scripts/cluster.py, the code `make cluster-up` runs (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpuaas_cluster", ROOT / "scripts" / "cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuaas_cluster"] = module
    spec.loader.exec_module(module)
    return module


_CLUSTERS: list[Any] = []


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real control plane of this session (scripts/cluster.py's `Cluster`), stopped at
    its end by kwokctl, every component by its PID. GPUAAS_TEST_CLUSTER=.cluster runs the
    tests on the cluster of `make cluster-up` instead, and leaves it running."""
    module = _cluster_module()
    reuse = os.environ.get("GPUAAS_TEST_CLUSTER")
    if reuse:
        existing = module.Cluster(Path(reuse).resolve())
        _CLUSTERS.append(existing)
        yield existing
        _CLUSTERS.remove(existing)
        return
    root = tmp_path_factory.mktemp("cluster")
    started = module.up(root)
    _CLUSTERS.append(started)
    try:
        yield started
    finally:
        _CLUSTERS.remove(started)
        module.down(root)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test on the real cluster reports the tail of every component's log."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _CLUSTERS and "cluster" in getattr(item, "fixturenames", ()):
        report.sections.append(("cluster logs", _CLUSTERS[0].log_tail()))


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
    """The real gateway with simulated devices named like the double's Nodes (kubefix)."""
    app = await start_gateway(tmp_path, quotas=QUOTAS, devices=DEVICES)
    try:
        yield app
    finally:
        await app.stop_server()


@pytest_asyncio.fixture
async def make_cluster_gateway(k8s: KubernetesDouble, tmp_path: Path) -> AsyncIterator[Any]:
    """`await make(scaler)`: the real gateway whose inventory is the double's Nodes
    (`--devices kubernetes`), with a scaler of gateway/cluster.py (ProvisioningRequestScaler,
    PlaceholderScaler) or the default one (None). Default flavors: the `pool=a100` pool of
    kubeutil.POOL_A100; default quotas: kubeutil.SCALE_QUOTAS (a100 autoscaled)."""
    apps: list[Any] = []

    async def make(
        scaler: str | None = None,
        *,
        flavors: dict[str, Any] | None = None,
        quotas: dict[str, Any] | None = None,
        db_url: str | None = None,
    ) -> Any:
        flavors = flavors or {"a100": POOL_A100}
        quotas = quotas or SCALE_QUOTAS
        config: dict[str, Any] = {"ClusterInventory": {"flavors": flavors}}
        if scaler is not None:
            per_node = {n: f["gpus_per_node"] for n, f in quotas["flavors"].items()}
            config["ClusterScaler"] = {
                "namespace": "jhub",
                "flavors": {n: {**f, "gpus_per_node": per_node[n]} for n, f in flavors.items()},
            }
        app = await start_gateway(
            tmp_path,
            quotas=quotas,
            devices="kubernetes",
            config=Config(config),
            scaler=f"jupyter_gpuaas.gateway.cluster.{scaler}" if scaler else None,
            db_url=db_url,
        )
        apps.append(app)
        return app

    try:
        yield make
    finally:
        for app in apps:
            await app.stop_server()


@pytest_asyncio.fixture
async def kube(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeOnCluster]:
    """The session's real cluster for one test: a namespace of its own, KWOK Nodes it adds
    deleted after it, and $KUBECONFIG (kubernetes_asyncio's too) pointing at the cluster."""
    import uuid

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    from kubernetes_asyncio.config import kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    on = KubeOnCluster(cluster, "jhub-" + uuid.uuid4().hex[:8])
    cluster.kubectl("create", "namespace", on.namespace)
    try:
        yield on
    finally:
        try:
            from kubespawner import KubeSpawner

            await KubeSpawner._stop_all_reflectors()
        except ImportError:
            pass
        on.close()


@pytest.fixture
def make_spawner(kube: KubeOnCluster, gateway: Any) -> Callable[..., Any]:
    """`make(user, **traits)`: the real QueuedKubeSpawner on the real cluster (in the
    test's namespace) and `gateway`, with a configured node selector, toleration and
    resource limit the grant must compose with."""

    def make(user: str = "alice", **traits: Any) -> Any:
        kw: dict[str, Any] = dict(
            flavors=FLAVORS,
            node_selector={"team": "ml"},
            tolerations=[{"key": "spot", "operator": "Exists"}],
            extra_resource_limits={"ephemeral-storage": "10Gi"},
        )
        kw.update(traits)
        kw.setdefault("namespace", kube.namespace)
        return kube_spawner(kube.url, gateway.url, user, **kw)

    return make
