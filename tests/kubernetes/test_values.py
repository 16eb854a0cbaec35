"""hub_config/kubernetes/values.yaml (zero-to-jupyterhub): it validates against the chart's
values schema, its Python runs and sets only traits that exist, its spawner config passes
QueuedKubeSpawner's own validation, its profiles' GPU blocks are valid, its flavors are the
ones the deployment guide's `kubernetes manifests` command gives the gateway
(docs/how-to/zero-to-jupyterhub.md), and the users' servers
get the Kubernetes GPU kernelspecs (kernels in pods of their own), the config of those
pods, the ServiceAccount the manifests give rights to, and network rules that let the
kernel pods and the server talk. No cluster: the config is executed against a traitlets
Config, as the Hub would load it, and the kernelspec commands run here."""

from __future__ import annotations

import shlex
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from traitlets.config import Config

from jupyter_gpuaas.cli import main
from jupyter_gpuaas.hub.k8s import validate_flavors
from jupyter_gpuaas.hub.kube import profile_gpus
from jupyter_gpuaas.kubeapi.meta import NAME

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "hub_config" / "kubernetes" / "values.yaml"
# The how-to guide that walks an admin through the deployment (the README's section before).
GUIDE = ROOT / "docs" / "how-to" / "zero-to-jupyterhub.md"
Z2JH_SCHEMA = Path(__file__).parent / "crds" / "zero-to-jupyterhub.values.schema.yaml"


def values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return data


def hub_flavors(c: Config) -> dict[str, Any]:
    """The Hub's flavors less what only the spawn form shows: the cluster's own format."""
    return {
        name: {k: v for k, v in spec.items() if k != "display_name"}
        for name, spec in c.QueuedSpawnerMixin.flavors.items()
    }


def readme_manifest_args() -> list[str]:
    """The flags of the deployment guide's `jupyter-gpuaas kubernetes manifests` command."""
    text = GUIDE.read_text()
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
    assert gateway["ClusterInventory"]["flavors"] == hub_flavors(c)
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    assert c.QueuedSpawnerMixin.gateway_url.startswith(
        f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}/"
    )
    # The users' servers run as the account the manifests give the kernel pods' rights to.
    account = values()["singleuser"]["serviceAccountName"]
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == account]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]} in (
        role["rules"]
    )
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == account]
    assert binding["subjects"][0]["name"] == account
    assert [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account]


def without_required(schema: Any) -> Any:
    """The schema less the `required` keys of the chart's own sections (hub, hub.image, ...:
    the chart's default values hold those); a list entry's or a file's own stay."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "required"}
    if "properties" in out:
        out["properties"] = {k: without_required(v) for k, v in out["properties"].items()}
    return out


def test_the_values_validate_against_the_charts_schema() -> None:
    """zero-to-jupyterhub's own values schema (vendored: hub, proxy, singleuser): every key
    is one the chart knows (`additionalProperties: false` throughout), of its type."""
    schema = without_required(yaml.safe_load(Z2JH_SCHEMA.read_text()))
    jsonschema.validate(values(), schema)
    with pytest.raises(jsonschema.ValidationError):  # the check is not vacuous
        jsonschema.validate({"singleuser": {"serviceAccount": "x"}}, schema)


def test_the_hub_config_sets_only_traits_that_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    from traitlets.utils.importstring import import_item

    from jupyter_gpuaas.hub.kube import QueuedKubeSpawner

    c = hub_config(monkeypatch)
    assert issubclass(import_item(c.JupyterHub.spawner_class), QueuedKubeSpawner)
    from jupyterhub.app import JupyterHub

    classes = {"JupyterHub": JupyterHub, **{k.__name__: k for k in QueuedKubeSpawner.mro()}}
    assert set(c) <= set(classes), set(c) - set(classes)
    for section, settings in c.items():
        traits = classes[section].class_trait_names(config=True)
        assert set(settings) <= set(traits), (section, set(settings) - set(traits))


def test_the_users_servers_get_the_kubernetes_kernelspecs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The postStart commands, run here with the real CLI into a user data dir: each
    installs a kernelspec of the `gpuaas-kubernetes` provisioner (a kernel in a pod of its
    own), never a local GPU kernel, for a flavor the Hub and the kernel pods know."""
    from jupyter_client.kernelspec import KernelSpecManager

    from jupyter_gpuaas.server.kernelspec_cli import POD_ARGV

    c = hub_config(monkeypatch)
    hook = values()["singleuser"]["lifecycleHooks"]["postStart"]["exec"]["command"]
    assert hook[:2] == ["sh", "-c"]
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    names = []
    for command in hook[2].split("&&"):
        argv = shlex.split(command)
        assert argv[:3] == ["jupyter-gpuaas", "kernelspec", "install"], argv
        assert main(argv[1:]) == 0, capsys.readouterr().err
        names.append(argv[argv.index("--name") + 1])
    assert names == ["python3-a100", "python3-mig"]
    provisioners = {e.name for e in entry_points(group="jupyter_client.kernel_provisioners")}
    pod_flavors = singleuser_server_config()["GpuaasKubernetesProvisioner"]["flavors"]
    specs = KernelSpecManager().get_all_specs()
    for name in names:
        spec = specs[name]["spec"]
        assert specs[name]["resource_dir"].startswith(str(tmp_path / "data"))
        provisioner = spec["metadata"]["kernel_provisioner"]
        assert provisioner["provisioner_name"] == "gpuaas-kubernetes"
        assert provisioner["provisioner_name"] in provisioners
        assert spec["argv"] == POD_ARGV  # what the kernel's pod runs
        flavor = provisioner["config"]["flavor"]
        assert flavor in c.QueuedSpawnerMixin.flavors and flavor in pod_flavors
        assert "own pod" in spec["display_name"]


def singleuser_server_config() -> dict[str, Any]:
    (file,) = [
        f
        for f in values()["singleuser"]["extraFiles"].values()
        if f["mountPath"].endswith("/jupyter_server_config.json")
    ]
    data: dict[str, Any] = file["data"]
    return data


def test_the_kernel_pods_config_names_the_hubs_flavors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The servers' config file (singleuser.extraFiles, rendered as JSON): in a directory
    Jupyter reads config from, setting only traits the provisioner has, with the Hub's
    flavors."""
    from jupyter_core.paths import SYSTEM_CONFIG_PATH

    from jupyter_gpuaas.kubernetes.kernels import GpuaasKubernetesProvisioner

    (file,) = [
        f
        for f in values()["singleuser"]["extraFiles"].values()
        if "GpuaasKubernetesProvisioner" in f["data"]
    ]
    assert str(Path(file["mountPath"]).parent) in SYSTEM_CONFIG_PATH
    config = singleuser_server_config()
    assert set(config) == {"GpuaasKubernetesProvisioner"}
    traits = GpuaasKubernetesProvisioner.class_trait_names(config=True)
    assert set(config["GpuaasKubernetesProvisioner"]) <= set(traits)
    flavors = config["GpuaasKubernetesProvisioner"]["flavors"]
    assert flavors == hub_flavors(hub_config(monkeypatch))
    assert validate_flavors(flavors) == flavors

    # As z2jh renders it (JSON), jupyter_server loads it into the config that its kernel
    # managers, and so their provisioners, inherit.
    import json

    from jupyter_server.serverapp import ServerApp

    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / Path(file["mountPath"]).name).write_text(json.dumps(file["data"]))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "user-config"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(etc))
    app = ServerApp()
    app.load_config_file()
    assert app.config.GpuaasKubernetesProvisioner.flavors == flavors


def test_the_network_rules_let_the_kernel_pods_and_the_server_talk() -> None:
    """z2jh's singleuser NetworkPolicy with the values' rules (strictly valid as a
    NetworkPolicy): the kernel pods (by their labels) may reach the server's response
    port, and the server may reach them."""
    import gateway_provisioners.response_manager as rm

    from jupyter_gpuaas.kubernetes.kernel_pods import kernel_pod_manifest

    policy = values()["singleuser"]["networkPolicy"]
    kubernetes_validate.validate(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "singleuser"},
            "spec": {
                "podSelector": {"matchLabels": {"component": "singleuser-server"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": policy["ingress"],
                "egress": policy["egress"],
            },
        },
        "1.30",
        strict=True,
    )
    pod = kernel_pod_manifest(
        name="alice-k1",
        kernel_id="k1",
        user="alice",
        command=["python"],
        image="img",
        request={"id": "r-1", "tenant": "vision", "gpus": 1, "grant": {"flavor": "a100"}},
        flavors={},
    )
    kernel = pod["metadata"]["labels"]

    def selects(peer: dict[str, Any], labels: dict[str, str]) -> bool:
        wanted = peer.get("podSelector", {}).get("matchLabels", {})
        return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())

    (inbound,) = [r for r in policy["ingress"] if any(selects(p, kernel) for p in r["from"])]
    assert {"port": rm.desired_response_port, "protocol": "TCP"} in inbound["ports"]
    (outbound,) = [r for r in policy["egress"] if any(selects(p, kernel) for p in r["to"])]
    assert "ports" not in outbound  # the kernel's ports are picked when it starts
    # ... and the gateway's pods (the manifests' Deployment) stay reachable on its port.
    from jupyter_gpuaas.kubeapi.meta import PORT, Settings
    from jupyter_gpuaas.kubernetes.manifests import deployment

    gateway = deployment(Settings())["spec"]["template"]["metadata"]["labels"]
    (to_gateway,) = [r for r in policy["egress"] if any(selects(p, gateway) for p in r["to"])]
    assert to_gateway["ports"] == [{"port": PORT, "protocol": "TCP"}]


def test_the_guide_walks_a_newcomer_through_the_deployment() -> None:
    """The deployment guide: the manifests through `kubectl apply`, then z2jh through
    `helm upgrade` with this values file, in that order, naming files that exist and the
    account the values file uses."""
    import re

    section = GUIDE.read_text()
    apply = section.index("| kubectl apply -f -")
    helm = section.index("helm upgrade --install jhub jupyterhub/jupyterhub")
    assert apply < helm
    assert "--values hub_config/kubernetes/values.yaml" in section[helm:]
    for path in re.findall(r"hub_config/[\w./-]+\.yaml", section):
        assert (ROOT / path).exists(), path
    assert values()["singleuser"]["serviceAccountName"] in section
