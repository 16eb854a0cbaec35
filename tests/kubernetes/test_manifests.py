"""`jupyter-gpuaas kubernetes manifests`: every document validated against the Kubernetes
OpenAPI schemas (the kubernetes-validate package, strict: unknown fields are errors), the
ScaledObject and ProvisioningRequest against those projects' published CRD schemas
(vendored under crds/, made strict the same way), key objects compared by dict equality,
and bad input exiting 2 with one line; and every document applied, with strict field
validation, to the real API server of the session's cluster (conftest.py's `cluster`, with
the ScaledObject and ProvisioningRequest CRDs of those projects' Go modules installed),
where the pods of its Deployments are then bound by the real scheduler.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubeschemas import validate

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.cli import main
from jupyter_gpuaas.kubeapi.meta import ClusterFlavor, Settings
from jupyter_gpuaas.kubeapi.scaleup import nodes_wanted_query, provisioning_request
from jupyter_gpuaas.kubernetes.manifests import rules, singleuser_rules

QUOTAS = """\
# the lab's GPUs
flavors:
  a100: {nodes: 2, gpus_per_node: 8}
  mig: {nodes: 1, gpus_per_node: 7}
tenants:
  vision: {cohort: lab, quota: {a100: 8, mig: 7}}
  nlp: {cohort: lab, quota: {a100: 8}}
policy:
  autoscale:
    a100: {max_nodes: 6, provision: false}
"""
SELECTOR = "a100=nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB,cloud.google.com/gke-nodepool=a100"


@pytest.fixture
def run_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """`jupyter-gpuaas kubernetes manifests --quotas FILE ARGS`: (exit code, stdout, stderr)."""

    def run(*args: str, quotas: str = QUOTAS) -> tuple[int, str, str]:
        q = tmp_path / "quotas.yaml"
        q.write_text(quotas)
        capsys.readouterr()
        code = main(["kubernetes", "manifests", "--quotas", str(q), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize("scale_up", ["keda", "provisioning-request", "placeholders", "none"])
@pytest.mark.slow
def test_every_document_validates(run_cli: Any, scale_up: str) -> None:
    code, out, err = run_cli(
        "--namespace",
        "lab",
        "--image",
        "registry.example/gpuaas:1",
        "--scale-up",
        scale_up,
        "--flavor-selector",
        SELECTOR,
        "--flavor-resource",
        "mig=nvidia.com/mig-1g.10gb",
    )
    assert (code, err) == (0, "")
    docs = list(yaml.safe_load_all(out))
    kinds = [d["kind"] for d in docs]
    for doc in docs:
        validate(doc)
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "jupyter-gpuaas"
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding", "PriorityClass"):
            assert doc["metadata"]["namespace"] == "lab"
    base = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    users = ["ServiceAccount", "Role", "RoleBinding"]  # the users' servers' (kernel pods)
    gateway = ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap"]
    pr = ["PodTemplate", "ProvisioningRequest"]
    role = ["Role", "RoleBinding"]
    expected = {
        "keda": [*base, *users, *gateway, "PriorityClass", "Deployment", "ScaledObject"],
        "placeholders": [*base, *role, *users, *gateway, "PriorityClass", "Deployment"],
        "provisioning-request": [*base, *role, *users, *gateway, *pr],
        "none": [*base, *users, *gateway],
    }[scale_up]
    assert kinds == expected
    (config_map,) = [
        d for d in docs if d["metadata"]["name"] == "jupyter-gpuaas" and d["kind"] == "ConfigMap"
    ]
    assert config_map["data"]["quotas.yaml"] == QUOTAS  # the admin's file, comments kept
    assert parse_config(yaml.safe_load(config_map["data"]["quotas.yaml"]))
    config = yaml.safe_load(config_map["data"]["gpuaas_config.json"])
    assert config["ClusterInventory"]["flavors"] == {
        "a100": {
            "node_selector": {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "cloud.google.com/gke-nodepool": "a100",
            },
            "resource": "nvidia.com/gpu",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        "mig": {
            "node_selector": {"gpuaas.jupyter.org/flavor": "mig"},
            "resource": "nvidia.com/mig-1g.10gb",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
    }


@pytest.mark.parametrize("scale_up", ["keda", "provisioning-request", "placeholders", "none"])
def test_every_document_applies_to_the_real_api_server(
    run_cli: Any, cluster: Any, scale_up: str
) -> None:
    """The API server, not a copy of its schemas, takes every object: strict field
    validation (an unknown field is an error), the CRDs' structural schemas and CEL rules,
    the API server's own validation of each kind, and the default admission plugins."""
    ns = f"manifests-{scale_up}"
    code, out, err = run_cli(
        "--namespace",
        ns,
        "--image",
        "registry.example/gpuaas:1",
        "--scale-up",
        scale_up,
        "--flavor-selector",
        "a100=pool=a100",
        "--flavor-resource",
        "mig=nvidia.com/mig-1g.10gb",
    )
    assert (code, err) == (0, "")
    docs = list(yaml.safe_load_all(out))
    cluster.kubectl("create", "namespace", ns)
    try:
        applied = cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "--validate=strict", "-f", "-", input=out
        )
        assert len(applied.splitlines()) == len(docs)
        for doc in docs:
            kind = doc["kind"].lower()
            where = ["-n", ns] if doc["metadata"].get("namespace") else []
            got = yaml.safe_load(
                cluster.kubectl("get", kind, doc["metadata"]["name"], *where, "-o", "yaml")
            )
            assert got["metadata"]["labels"] == doc["metadata"]["labels"]
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_the_real_api_server_refuses_a_misspelt_field(cluster: Any) -> None:
    """The check above can fail: strict field validation names the unknown field."""
    bad = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "misspelt", "namespace": "default"},
        "dta": {"a": "b"},
    }
    with pytest.raises(RuntimeError, match="dta"):
        cluster.kubectl(
            "apply", "--server-side", "--validate=strict", "-f", "-", input=yaml.safe_dump(bad)
        )


def test_the_example_provisioning_request_is_shaped_like_one_blocked_head(run_cli: Any) -> None:
    """The example is what the gateway makes per capacity-blocked head: one pod asking
    for that head's GPUs (here one) of the flavor, not a whole node's 8."""
    code, out, _ = run_cli("--scale-up", "provisioning-request", "--flavor-selector", SELECTOR)
    assert code == 0
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out)}
    name = "jupyter-gpuaas-example-a100"
    request = docs[("ProvisioningRequest", name)]
    assert request["spec"] == {
        "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
        "podSets": [{"count": 1, "podTemplateRef": {"name": name}}],
    }
    spec = docs[("PodTemplate", name)]["template"]["spec"]
    gpu = {"nvidia.com/gpu": "1"}
    assert spec == {
        "nodeSelector": {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "cloud.google.com/gke-nodepool": "a100",
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "pause",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": gpu, "limits": gpu},
            }
        ],
    }
    # Only a100 may grow (policy.autoscale): no example for mig.
    assert ("ProvisioningRequest", "jupyter-gpuaas-example-mig") not in docs


def test_the_validation_can_fail() -> None:
    """The checks above are not vacuous: a misspelt field fails each kind of schema."""
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "x"},
                "spec": {"prots": []},
            }
        )
    bad = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "x"},
        "spec": {"scaleTargetRef": {"name": "d"}, "triggers": [{"type": "prometheus"}]},
    }
    with pytest.raises(jsonschema.ValidationError, match="metadata"):
        validate(bad)
    bad_pr = provisioning_request("x", "Bad_Name", 0, Settings())
    with pytest.raises(jsonschema.ValidationError):
        validate(bad_pr)


def test_gateway_deployment(run_cli: Any) -> None:
    code, out, _ = run_cli("--scale-up", "none")
    assert code == 0
    (dep,) = [d for d in yaml.safe_load_all(out) if d["kind"] == "Deployment"]
    spec = dep["spec"]
    # A leader and a standby (leader.py); a rollout adds a pod before it removes one.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (c,) = spec["template"]["spec"]["containers"]
    assert "--leader-election=on" in c["args"]
    assert "--advertise-url=http://$(POD_IP):8765/services/gpuaas/" in c["args"]
    # $(POD_IP) expands only from a variable defined in the container's env.
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    # No annotation-driven scrape: it would carry no token and get 401.
    assert not any(
        k.startswith("prometheus.io/") for k in spec["template"]["metadata"].get("annotations", {})
    )
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    probe = {
        "httpGet": {"path": "/services/gpuaas/api/health", "port": "http"},
        "timeoutSeconds": 5,
    }
    assert c["readinessProbe"] == {**probe, "periodSeconds": 10, "failureThreshold": 3}
    assert c["livenessProbe"] == {
        **probe,
        "initialDelaySeconds": 15,
        "periodSeconds": 20,
        "failureThreshold": 6,
    }
    assert "--devices=kubernetes" in c["args"] and "--db-url=$(GPUAAS_DB_URL)" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUAAS_DB_URL"] == {
        "name": "GPUAAS_DB_URL",
        "valueFrom": {"secretKeyRef": {"name": "jupyter-gpuaas-db", "key": "url"}},
    }
    assert env["JUPYTERHUB_SERVICE_PREFIX"]["value"] == "/services/gpuaas/"
    assert spec["template"]["spec"]["serviceAccountName"] == "jupyter-gpuaas"


def test_rbac_holds_only_the_verbs_used() -> None:
    nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    assert rules("keda") == ([nodes], [])
    assert rules("none") == ([nodes], [])
    assert rules("placeholders") == (
        [nodes],
        [{"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"]}],
    )
    assert rules("provisioning-request") == (
        [nodes],
        [
            {
                "apiGroups": ["autoscaling.x-k8s.io"],
                "resources": ["provisioningrequests"],
                "verbs": ["create", "delete", "list"],
            },
            {
                "apiGroups": [""],
                "resources": ["podtemplates"],
                "verbs": ["create", "delete", "list"],
            },
        ],
    )


@pytest.mark.parametrize("access", ["kernels", "kernels-and-jobs", "none"])
@pytest.mark.slow
def test_the_users_servers_get_only_what_their_kernel_pods_and_jobs_use(
    run_cli: Any, access: str
) -> None:
    """The users' servers' ServiceAccount and Role (z2jh `singleuser.serviceAccountName`):
    the verbs of the `gpuaas-kubernetes` provisioner and, when chosen, of the
    KubernetesJobRunner; test_kernels.py and test_kube_jobs.py run those as this
    ServiceAccount on the real API server, whose authorizer refuses any other verb."""
    code, out, err = run_cli("--namespace", "lab", "--singleuser-access", access)
    assert (code, err) == (0, "")
    docs = [
        d for d in yaml.safe_load_all(out) if d["metadata"]["name"] == "jupyter-gpuaas-singleuser"
    ]
    for doc in docs:
        validate(doc)
    if access == "none":
        assert docs == []
        return
    account, role, binding = docs
    assert (account["kind"], role["kind"], binding["kind"]) == (
        "ServiceAccount",
        "Role",
        "RoleBinding",
    )
    assert account["metadata"]["namespace"] == role["metadata"]["namespace"] == "lab"
    kernels = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]}]
    assert role["rules"] == singleuser_rules(access)
    if access == "kernels":
        assert role["rules"] == kernels
    else:
        assert role["rules"] == [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["create", "get", "delete", "list"],
            },
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "list", "delete"]},
        ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "jupyter-gpuaas-singleuser",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "jupyter-gpuaas-singleuser", "namespace": "lab"}
    ]


def _can_i(cluster: Any, token: str, verb: str, resource: str, ns: str, group: str = "") -> bool:
    """`kubectl auth can-i` as the holder of `token` (no admin certificate: the API server
    authenticates the ServiceAccount's token and RBAC decides); `resource` may name a
    subresource (`deployments/scale`)."""
    resource, _, sub = resource.partition("/")
    what = [
        f"{resource}.{group}" if group else resource,
        *([f"--subresource={sub}"] if sub else []),
    ]
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    proc = subprocess.run(
        [
            str(cluster.bin / "kubectl"),
            "--kubeconfig=/dev/null",
            f"--server={server}",
            f"--certificate-authority={cluster.workdir / 'pki' / 'ca.crt'}",
            f"--token={token}",
            "auth",
            "can-i",
            verb,
            *what,
            "-n",
            ns,
        ],
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.stdout.strip() == "yes"


@pytest.mark.parametrize("scale_up", ["provisioning-request", "placeholders"])
def test_the_service_accounts_tokens_hold_exactly_their_rules(
    run_cli: Any, cluster: Any, scale_up: str
) -> None:
    """The manifests applied to the real API server, then each ServiceAccount's own token
    (`kubectl create token`: the API server issues it) asked, verb by verb, what RBAC lets
    it do: every verb of its rules, and nothing next to them."""
    ns = f"rbac-{scale_up}"
    code, out, _ = run_cli(
        "--namespace",
        ns,
        "--scale-up",
        scale_up,
        "--flavor-selector",
        "a100=pool=a100",
        "--singleuser-access",
        "kernels-and-jobs",
    )
    assert code == 0
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.kubectl("apply", "--server-side", "-f", "-", input=out)
        cluster_rules, ns_rules = rules(scale_up)
        accounts = {
            "jupyter-gpuaas": [*cluster_rules, *ns_rules],
            "jupyter-gpuaas-singleuser": singleuser_rules("kernels-and-jobs"),
        }
        for account, granted in accounts.items():
            token = cluster.kubectl("create", "token", account, "-n", ns).strip()
            for rule in granted:
                for resource in rule["resources"]:
                    group = rule["apiGroups"][0]
                    for verb in rule["verbs"]:
                        assert _can_i(cluster, token, verb, resource, ns, group), (
                            account,
                            verb,
                            resource,
                        )
            # Nothing beside them: no Secrets, no deleting Nodes, no cluster-wide pods.
            assert not _can_i(cluster, token, "get", "secrets", ns), account
            assert not _can_i(cluster, token, "delete", "nodes", ns), account
            assert not _can_i(cluster, token, "create", "pods", "kube-system"), account
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_scaled_object_reads_the_nodes_wanted(run_cli: Any) -> None:
    code, out, _ = run_cli("--prometheus-url", "http://prom:9090")
    assert code == 0
    (so,) = [d for d in yaml.safe_load_all(out) if d["kind"] == "ScaledObject"]
    assert so["spec"] == {
        "scaleTargetRef": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "jupyter-gpuaas-placeholder-a100",
        },
        "minReplicaCount": 0,
        "maxReplicaCount": 4,  # max_nodes 6 minus the 2 the pool has
        "pollingInterval": 15,
        "cooldownPeriod": 300,
        "triggers": [
            {
                "type": "prometheus",
                "name": "gpuaas-desired-nodes-a100",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": "http://prom:9090",
                    "query": nodes_wanted_query("a100"),
                    "threshold": "1",
                    "activationThreshold": "0",
                    "ignoreNullValues": "false",
                },
            }
        ],
    }
    assert nodes_wanted_query("a100") == (
        'clamp_min(max(gpuaas_desired_nodes{flavor="a100"}) - '
        '(max(gpuaas_nodes{flavor="a100"}) or vector(0)), 0)'
    )
    (placeholder,) = [
        d
        for d in yaml.safe_load_all(out)
        if d["kind"] == "Deployment" and "placeholder" in d["metadata"]["name"]
    ]
    pod = placeholder["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "jupyter-gpuaas-placeholder"
    assert pod["containers"][0]["resources"] == {
        "requests": {"nvidia.com/gpu": "8"},
        "limits": {"nvidia.com/gpu": "8"},
    }


def test_provisioning_request_classes() -> None:
    flavor = ClusterFlavor("a100", 8, {"pool": "a100"})
    assert flavor.growth == 0
    got = provisioning_request(
        "r", "t", 2, Settings(provisioning_class="best-effort-atomic-scale-up.autoscaling.x-k8s.io")
    )
    assert got["spec"] == {
        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "podSets": [{"count": 2, "podTemplateRef": {"name": "t"}}],
        "parameters": {"ValidUntilSeconds": "3600"},
    }
    validate(got)


@pytest.mark.parametrize(
    ("args", "quotas", "message"),
    [
        (
            ["--flavor-selector", "h100=pool=h100"],
            QUOTAS,
            "--flavor-selector h100: unknown flavor 'h100' (the quota file's flavors: a100, mig)",
        ),
        (
            ["--flavor-resource", "t4=nvidia.com/gpu"],
            QUOTAS,
            "--flavor-resource t4: unknown flavor 't4' (the quota file's flavors: a100, mig)",
        ),
        (
            ["--flavor-selector", "a100=bad key!=x"],
            QUOTAS,
            "--flavor-selector a100: 'bad key!' is not a valid Kubernetes label name",
        ),
        (["--flavor-selector", "a100"], QUOTAS, "--flavor-selector a100: expected FLAVOR=VALUE"),
        (
            ["--scale-up", "provisioning-request", "--provisioning-class", "check.example"],
            QUOTAS,
            "--provisioning-class: 'check.example' is not one of check-capacity.autoscaling",
        ),
        (
            [],
            QUOTAS.replace("max_nodes: 6", "max_nodes: 2"),
            "--scale-up keda: no flavor may grow",
        ),
        (
            [],
            QUOTAS.replace("mig: 7}", "h100: 7}"),
            "tenants.vision.quota.h100: unknown flavor 'h100' (flavors: a100, mig)",
        ),
        ([], "flavors: {a100: {nodes: 1}\n", "not valid YAML"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    run_cli: Any, args: list[str], quotas: str, message: str
) -> None:
    code, out, err = run_cli(*args, quotas=quotas)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("jupyter-gpuaas kubernetes manifests: ")
    assert message in err


def test_the_console_script(tmp_path: Path) -> None:
    """The real `jupyter-gpuaas` entry point, a missing quota file: exit 2, one line."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter_gpuaas.cli",
            "kubernetes",
            "manifests",
            "--quotas",
            str(tmp_path / "nope.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"jupyter-gpuaas kubernetes manifests: --quotas {tmp_path / 'nope.yaml'}: "
        "No such file or directory"
    ]


def test_the_scrape_job_finds_both_gateway_pods_with_a_token(run_cli: Any) -> None:
    """The shipped Prometheus job: the view-scoped token from a file (metrics refuses a
    scrape without one), the gateway's metrics path, and relabelling that keeps exactly
    the Deployment's pods on their `http` port. Tests/gateway/test_metrics_leader.py runs
    its token and path with a real Prometheus against a leader and a standby."""
    code, out, _ = run_cli("--namespace", "lab", "--scale-up", "none")
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    (cm,) = [d for d in docs if d["metadata"]["name"] == "jupyter-gpuaas-prometheus"]
    (job,) = yaml.safe_load(cm["data"]["scrape-configs.yaml"])
    assert job["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/secrets/jupyter-gpuaas-metrics/token",
    }
    assert job["metrics_path"] == "/services/gpuaas/metrics"
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["lab"]}}]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]
    meta = {
        "__meta_kubernetes_pod_label_" + k.replace(".", "_").replace("/", "_").replace("-", "_"): v
        for k, v in pod["metadata"]["labels"].items()
    }
    meta["__meta_kubernetes_pod_container_port_name"] = pod["spec"]["containers"][0]["ports"][0][
        "name"
    ]
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert len(keeps) == 3
    for rule in keeps:
        (source,) = rule["source_labels"]
        assert meta.get(source) == rule["regex"], (source, rule)
    # Not the annotations job's: no pod of ours asks to be scraped without a token.
    assert "annotations" not in pod["metadata"]


def test_both_replicas_sign_logins_with_the_secret_key(run_cli: Any, tmp_path: Path) -> None:
    """The init container's own command, run here on a copy of the Secret's file: the
    gateway's cookie key file is the Secret's key, mode 0600 (load_cookie_secret refuses
    anything others may read), where the gateway container is told to read it."""
    from jupyter_gpuaas.gateway.auth import load_cookie_secret

    code, out, _ = run_cli("--scale-up", "none")
    assert code == 0
    (dep,) = [d for d in yaml.safe_load_all(out) if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (gateway,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["secret"]["secret"]["secretName"] == "jupyter-gpuaas-hub"
    assert volumes["run"]["emptyDir"]["medium"] == "Memory"
    python, flag, script, src, dst = init["command"]
    assert (python, flag) == ("python3", "-c")
    assert f"--cookie-secret-file={dst}" in gateway["args"]
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    assert mounts[src.rsplit("/", 1)[0]] == "secret"
    run_dir = dst.rsplit("/", 1)[0]
    assert mounts[run_dir] == "run"
    assert {"name": "run", "mountPath": run_dir, "readOnly": True} in gateway["volumeMounts"]

    key = "ab" * 32
    secret_file = tmp_path / "cookie-secret"
    secret_file.write_text(key + "\n")
    secret_file.chmod(0o644)  # a Secret volume's file: root's, readable by all
    copied = tmp_path / "run" / "cookie_secret"
    copied.parent.mkdir()
    subprocess.run([sys.executable, "-c", script, str(secret_file), str(copied)], check=True)
    assert copied.stat().st_mode & 0o777 == 0o600
    assert load_cookie_secret(copied) == bytes.fromhex(key)
