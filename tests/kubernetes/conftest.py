"""Fixtures of the Kubernetes tests.

`cluster`: the REAL control plane (issue 39), one for the session: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK's GPU nodes and Kueue, built from the Go
modules pinned in cluster/ and started by scripts/cluster.py through kwokctl (what
`make cluster-up` runs). A test that fails while it is up gets every component's log tail
in its report. Every test of tests/kubernetes that talks to Kubernetes runs on it.

`kube`: that cluster for one test (a namespace of its own, the KWOK Nodes it adds,
$KUBECONFIG pointing at the cluster). `gateway`: the real gateway app in-process on a
loopback port (simulated devices named like the tests' KWOK Nodes, a token file);
`make_spawner`: the real QueuedKubeSpawner (a KubeSpawner subclass) with a stand-in for
the Hub's user object, talking to both over real HTTP (kubeutil.py has the helpers under
them). `db_url`: the gateway's store, SQLite or PostgreSQL.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gwutil import fresh_pg_database
from kubefix import DEVICES, FLAVORS, QUOTAS
from kubeutil import KubeOnCluster, kube_spawner, start_gateway

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


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store: SQLite, or a fresh database on the session's PostgreSQL (tests/pg.py),
    the store of the cluster mode (the manifests take its URL from a Secret)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpuaas.sqlite'}"
    return fresh_pg_database(request.getfixturevalue("postgres_url"), "k8s_")


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Any]:
    """The real gateway with simulated devices named like the tests' KWOK Nodes (kubefix)."""
    app = await start_gateway(tmp_path, quotas=QUOTAS, devices=DEVICES)
    try:
        yield app
    finally:
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
