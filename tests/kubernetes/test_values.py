"""hub_config/kubernetes/values.yaml (zero-to-jupyterhub): its Python runs, its spawner
config passes QueuedKubeSpawner's own validation, its profiles' GPU blocks are valid, and
its flavors are the ones the README's `kubernetes manifests` command gives the gateway.
No cluster: the config is executed against a traitlets Config, as the Hub would load it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from traitlets.config import Config

from jupyter_gpuaas.cli import main
from jupyter_gpuaas.hub.k8s import validate_flavors
from jupyter_gpuaas.hub.kube import profile_gpus
from jupyter_gpuaas.kubernetes.meta import NAME

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "hub_config" / "kubernetes" / "values.yaml"


def readme_manifest_args() -> list[str]:
    """The flags of the README's `jupyter-gpuaas kubernetes manifests` command."""
    text = (ROOT / "README.md").read_text()
    start = text.index("jupyter-gpuaas kubernetes manifests --quotas")
    command = text[start : text.index("| kubectl apply", start)]
    words = command.replace("\\\n", " ").split()
    return words[1:]


def hub_config(monkeypatch: pytest.MonkeyPatch) -> Config:
    values = yaml.safe_load(VALUES.read_text())
    monkeypatch.setenv("GPUAAS_SERVICE_TOKEN", "t0ken")
    monkeypatch.setenv("GPUAAS_METRICS_TOKEN", "scr4pe")
    c = Config()
    exec(compile(values["hub"]["extraConfig"]["gpuaas"], str(VALUES), "exec"), {"c": c})
    return c


def test_the_hub_config_runs_and_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    c = hub_config(monkeypatch)
    assert c.JupyterHub.spawner_class == "jupyter_gpuaas.hub.QueuedKubeSpawner"
    service, scraper = c.JupyterHub.services.get_value([])
    assert service["name"] == "gpuaas" and service["api_token"] == "t0ken"
    # Prometheus's token: the view scope on the gateway and nothing else (metrics).
    assert scraper == {"name": "gpuaas-metrics", "api_token": "scr4pe"}
    roles = {r["name"]: r for r in c.JupyterHub.load_roles.get_value([])}
    assert roles["gpuaas-metrics"] == {
        "name": "gpuaas-metrics",
        "scopes": ["access:services!service=gpuaas", "custom:gpuaas:view"],
        "services": ["gpuaas-metrics"],
    }
    values = yaml.safe_load(VALUES.read_text())
    env = values["hub"]["extraEnv"]["GPUAAS_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert env == {"name": "jupyter-gpuaas-metrics", "key": "token"}
    assert set(c.JupyterHub.custom_scopes) == {
        "custom:gpuaas:use",
        "custom:gpuaas:view",
        "custom:gpuaas:admin",
    }
    assert validate_flavors(c.QueuedSpawnerMixin.flavors) == c.QueuedSpawnerMixin.flavors
    values = yaml.safe_load(VALUES.read_text())
    for profile in values["singleuser"]["profileList"]:
        block = profile_gpus(profile)
        if block:
            assert block["flavor"] in c.QueuedSpawnerMixin.flavors
            assert block["gpus"] >= 1
    url = values["singleuser"]["extraEnv"]["GPUAAS_URL"]
    assert url == c.QueuedSpawnerMixin.gateway_url
    assert "kernelspec install" in " ".join(
        values["singleuser"]["lifecycleHooks"]["postStart"]["exec"]["command"]
    )


def test_the_flavors_match_the_readme_manifests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = hub_config(monkeypatch)
    args = readme_manifest_args()
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        "flavors:\n  a100: {nodes: 2, gpus_per_node: 8}\n  mig: {nodes: 1, gpus_per_node: 7}\n"
        "tenants:\n  vision: {quota: {a100: 8, mig: 7}}\n"
        "policy: {autoscale: {a100: {max_nodes: 4, provision: false}}}\n"
    )
    i = args.index("--quotas")
    args[i + 1] = str(quotas)
    assert main(args) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == NAME]
    gateway: dict[str, Any] = yaml.safe_load(cm["data"]["gpuaas_config.json"])
    spawner = {
        name: {k: v for k, v in spec.items() if k != "display_name"}
        for name, spec in c.QueuedSpawnerMixin.flavors.items()
    }
    assert gateway["ClusterInventory"]["flavors"] == spawner
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    assert c.QueuedSpawnerMixin.gateway_url.startswith(
        f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}/"
    )
