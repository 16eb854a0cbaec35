"""The `kubernetes` extra at whatever versions are installed (`make lowest` runs this with
the oldest its pins allow, issue 44): every kubernetes_asyncio name our code calls exists,
the classes we subclass (KubeSpawner, gateway_provisioners' KubernetesProvisioner) import
and take our mixins, a kubeconfig loads into a client, and the pure builders make their
manifests. No cluster: tests/kubernetes drives the real control plane at the newest."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jupyter_gpuaas"
# An API method of kubernetes_asyncio, called or handed to watch.Watch().stream.
API_METHOD = re.compile(
    r"\.((?:list|create|delete|patch|replace|read|get)_(?:namespaced_\w+|node))\b"
)
API_CLASS = re.compile(r"\bclient\.([A-Z]\w+)")


def users_of_the_client() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "from kubernetes_asyncio" in p.read_text()]


def test_every_kubernetes_asyncio_name_our_code_uses_exists() -> None:
    from kubernetes_asyncio import client, config, watch
    from kubernetes_asyncio.client.exceptions import ApiException

    files = users_of_the_client()
    assert len(files) >= 5, files
    classes = {name for p in files for name in API_CLASS.findall(p.read_text())}
    assert {"ApiClient", "CoreV1Api", "CustomObjectsApi"} <= classes
    for name in classes - {"AsyncHTTPClient"}:  # tornado's, not kubernetes_asyncio's
        assert hasattr(client, name), f"kubernetes_asyncio.client has no {name}"
    apis = [getattr(client, n) for n in classes if n.endswith("Api") and hasattr(client, n)]
    methods = {m for p in files for m in API_METHOD.findall(p.read_text())}
    assert {"list_node", "list_namespaced_pod", "create_namespaced_custom_object"} <= methods
    for m in methods:
        assert any(hasattr(api, m) for api in apis), f"no kubernetes_asyncio API has {m}"
    assert callable(config.load_kube_config) and callable(watch.Watch.stream)
    assert issubclass(ApiException, Exception)


def test_a_kubeconfig_loads_into_a_client(tmp_path: Path) -> None:
    from kubernetes_asyncio import client, config

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))  # fmt: skip

    async def load() -> str:
        await config.load_kube_config(config_file=str(kubeconfig))
        api = client.ApiClient()
        try:
            return str(api.configuration.host)
        finally:
            await api.close()

    assert asyncio.run(load()) == "https://127.0.0.1:6443"


def test_our_subclasses_of_kubespawner_and_the_provisioner_import() -> None:
    from gateway_provisioners.k8s import KubernetesProvisioner
    from kubespawner import KubeSpawner

    from jupyter_gpuaas.hub.kube import QueuedKubeSpawner
    from jupyter_gpuaas.kubernetes.kernels import GpuaasKubernetesProvisioner

    assert issubclass(QueuedKubeSpawner, KubeSpawner)
    assert issubclass(GpuaasKubernetesProvisioner, KubernetesProvisioner)
    traits = QueuedKubeSpawner.class_trait_names()
    assert {"pin_node_label", "kueue_queue", "image", "node_selector"} <= set(traits)


def test_the_manifests_are_built(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jupyter_gpuaas.cli import main

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("flavors: {a100: {nodes: 1, gpus_per_node: 8}}\n"
                      "tenants: {vision: {quota: {a100: 8}}}\n")  # fmt: skip
    assert main(["kubernetes", "manifests", "--quotas", str(quotas), "--scale-up", "none"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ConfigMap", "ClusterRole", "Role"} <= kinds, kinds
    assert all(d["apiVersion"] and d["metadata"]["name"] for d in docs)
