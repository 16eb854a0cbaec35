"""The real Kubernetes control plane of the tests and of `make cluster-up` (issue 39).

`build()` builds the pinned binaries of cluster/*/go.mod (kube-apiserver,
kube-controller-manager, kube-scheduler and kubectl of k8s.io/kubernetes; kwok and kwokctl;
the Kueue controller manager; etcd) with `go build` into a cache outside the tree,
~/.cache/jupyter-gpuaas/cluster/<key>/bin, where <key> hashes every go.mod and go.sum under
cluster/, this file's build recipe and the Go version: a change of pin builds anew, nothing
is built twice.

`up()` starts a cluster on loopback through kwokctl's binary runtime with those binaries
(kwokctl is the process manager: it records every component's PID and log, and
`kwokctl delete cluster` stops them by PID), then applies KWOK GPU nodes and starts Kueue
(its CRDs and webhook configuration read from the Go module cache, the webhooks reached by
`url:` on 127.0.0.1). `down()` stops it. The session fixture of tests/kubernetes/conftest.py
calls the same functions; `python scripts/cluster.py bin|up|down` is what the Makefile runs.

Nothing of another project is copied into the tree: KWOK's stages and Kueue's manifests are
read from $(go env GOMODCACHE) at run time.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "cluster"
CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jupyter-gpuaas" / "cluster"
)
CLUSTER_NAME = "gpuaas"
# Two clusters on one machine (two people's checkouts, or helpers side by side) must not hand
# their pods the same loopback IPs: a kernel process of one would answer for a pod of the other.
POD_CIDR = os.environ.get("GPUAAS_POD_CIDR", "127.20.0.0/16")
# Bump when the recipe below changes in a way the go.mod files do not show (flags, tags).
RECIPE = "1"


@dataclass(frozen=True)
class Component:
    """One `go build` of one of our modules under cluster/: its packages and the names of
    the binaries it leaves in bin/."""

    module: str
    packages: tuple[str, ...]
    binaries: tuple[str, ...]
    ldflags: tuple[str, ...] = ()
    tags: str = ""

    @property
    def dir(self) -> Path:
        return MODULES / self.module


def required_version(module: str, path: str) -> str:
    """The version a go.mod of ours requires of `path` (its `replace` wins)."""
    text = (MODULES / module / "go.mod").read_text()
    pat = re.compile(rf"^\s*(?:require\s+)?{re.escape(path)}\s+(v\S+)", re.M)
    replaced = re.search(rf"^\s*{re.escape(path)}\s*=>\s*\S+\s+(v\S+)", text, re.M)
    if replaced:
        return replaced.group(1)
    found = pat.search(text)
    if not found:
        raise SystemExit(f"cluster/{module}/go.mod does not require {path}")
    return found.group(1)


def components() -> list[Component]:
    k8s = required_version("kubernetes", "k8s.io/kubernetes")
    major, minor = k8s.lstrip("v").split(".")[:2]
    kube_ldflags = (
        f"-X k8s.io/component-base/version.gitVersion={k8s}",
        f"-X k8s.io/component-base/version.gitMajor={major}",
        f"-X k8s.io/component-base/version.gitMinor={minor}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
        f"-X k8s.io/client-go/pkg/version.gitVersion={k8s}",
        f"-X k8s.io/client-go/pkg/version.gitMajor={major}",
        f"-X k8s.io/client-go/pkg/version.gitMinor={minor}",
    )
    kwok = required_version("kwok", "sigs.k8s.io/kwok")
    kueue = required_version("kueue", "sigs.k8s.io/kueue")
    etcd = required_version("etcd", "go.etcd.io/etcd/server/v3")
    return [
        Component(
            "kubernetes",
            tuple(
                f"k8s.io/kubernetes/cmd/{c}"
                for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
            ),
            ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
            kube_ldflags,
        ),
        Component(
            "etcd",
            ("go.etcd.io/etcd/server/v3",),
            ("etcd",),
            (f"-X go.etcd.io/etcd/api/v3/version.GitSHA={etcd}",),
        ),
        Component(
            "kwok",
            ("sigs.k8s.io/kwok/cmd/kwok", "sigs.k8s.io/kwok/cmd/kwokctl"),
            ("kwok", "kwokctl"),
            (
                f"-X sigs.k8s.io/kwok/pkg/consts.Version={kwok.lstrip('v')}",
                # kwokctl's default Kubernetes: ours, so nothing it derives names another.
                f"-X sigs.k8s.io/kwok/pkg/consts.KubeVersion={k8s.lstrip('v')}",
            ),
        ),
        Component(
            "kueue",
            ("sigs.k8s.io/kueue/cmd/kueue",),
            ("kueue",),
            (f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={kueue}",),
        ),
    ]


def go(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["go", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def cache_key() -> str:
    h = hashlib.sha256()
    h.update(RECIPE.encode())
    h.update(go("version").encode())
    for f in sorted(MODULES.glob("*/go.*")):
        h.update(f.relative_to(MODULES).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def bin_dir() -> Path:
    return CACHE / cache_key() / "bin"


def say(msg: str) -> None:
    print(f"cluster: {msg}", flush=True)


def build() -> Path:
    """Build what is missing of the pinned binaries into the cache; the bin/ directory."""
    if shutil.which("go") is None:
        raise SystemExit("cluster: Go is not installed; the control plane is built from Go modules")
    out = bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    todo = [c for c in components() if not all((out / b).exists() for b in c.binaries)]
    if not todo:
        say(f"binaries up to date in {out}")
        return out
    for i, comp in enumerate(todo, 1):
        say(f"[{i}/{len(todo)}] building {', '.join(comp.binaries)} (cluster/{comp.module})")
        start = time.monotonic()
        tmp = out.parent / f"tmp-{comp.module}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        target = str(tmp / comp.binaries[0]) if len(comp.binaries) == 1 else str(tmp) + "/"
        cmd = ["go", "build", "-v", "-trimpath", "-ldflags", " ".join(("-s", "-w", *comp.ldflags))]
        if comp.tags:
            cmd += ["-tags", comp.tags]
        cmd += ["-o", target, *comp.packages]
        _run_counting(cmd, comp.dir)
        for b in comp.binaries:
            os.replace(tmp / b, out / b)
        tmp.rmdir()
        took = time.monotonic() - start
        say(f"[{i}/{len(todo)}] built {', '.join(comp.binaries)} in {took:.0f} s")
    return out


def _run_counting(cmd: Sequence[str], cwd: Path) -> None:
    """Run a `go build -v`, showing a count of the packages compiled instead of their names
    (thousands), and the whole output if it fails."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if len(lines) % 200 == 0:
            say(f"    {len(lines)} packages compiled")
    if proc.wait() != 0:
        sys.stdout.write("".join(lines[-60:]))
        raise SystemExit(f"cluster: `{' '.join(cmd)}` failed in {cwd}")


# ---------------------------------------------------------------------------------------
# The cluster


# KEDA's ScaledObject CRD (the `keda` scale-up's object), read from this release's module;
# KEDA is not built (nothing here runs it): only the CRD lets the API server take the object.
KEDA = ("github.com/kedacore/keda/v2", "v2.18.0")


def modcache(module: str, path: str, version: str | None = None) -> Path:
    """Where the Go module cache holds `path` at the version cluster/<module> pins (or
    `version`), downloaded there first if it is not."""
    version = version or required_version(module, path)
    root = Path(go("env", "GOMODCACHE"))
    escaped = re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), path)
    found = root / f"{escaped}@{version}"
    if not found.exists():
        go("mod", "download", f"{path}@{version}", cwd=Path("/"))
    return found


@dataclass
class Cluster:
    """A started cluster: its directory (.cluster/ for people, a temporary one in tests)."""

    root: Path

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def workdir(self) -> Path:
        """kwokctl's own directory of this cluster (pki, logs, pids)."""
        return self.root / "kwok" / "clusters" / CLUSTER_NAME

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def env(self) -> dict[str, str]:
        return {**os.environ, "KWOK_WORKDIR": str(self.root / "kwok")}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def apply(self, objects: Sequence[dict[str, Any]], *args: str) -> str:
        return self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            *args,
            "-f",
            "-",
            # JSON, not YAML: PyYAML writes a label like 508423e1 (a random hex name) or
            # Y unquoted, and Go's YAML reads it back as a number or a boolean.
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every component's log: what a failing test prints."""
        out = []
        for f in sorted(self.logs.glob("*.log")) if self.logs.exists() else []:
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"==== {f.name} (last {len(text)} lines) ====\n" + "\n".join(text))
        return "\n".join(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# KWOK GPU nodes: the node pools the flavors name (labels), their GPUs (extended resources,
# one MIG resource) and the taint GPU pools carry; one untainted CPU node for `gpus: 0`.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODES: dict[str, dict[str, Any]] = {
    "gpu-a100-0": {
        "labels": {"pool": "a100", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "resources": {"nvidia.com/gpu": "2"},
        "taints": [GPU_TAINT],
    },
    "gpu-t4-0": {
        "labels": {"pool": "t4", "nvidia.com/gpu.product": "Tesla-T4"},
        "resources": {"nvidia.com/gpu": "1"},
        "taints": [GPU_TAINT],
    },
    "gpu-mig-0": {
        "labels": {
            "gpuaas.jupyter.org/flavor": "mig",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
        },
        "resources": {"nvidia.com/mig-1g.10gb": "7"},
        "taints": [GPU_TAINT],
    },
    "cpu-node-0": {"labels": {"pool": "cpu"}, "resources": {}, "taints": []},
}


def kwok_node(
    name: str, labels: dict[str, str], resources: dict[str, str], taints: list[dict[str, str]]
) -> dict[str, Any]:
    """A Node KWOK plays (its annotation), with the capacity of a 32-core host and its disk
    (a pod with an ephemeral-storage limit fits only where a node declares some)."""
    capacity = {
        "cpu": "32",
        "memory": "256Gi",
        "ephemeral-storage": "1Ti",
        "pods": "110",
        **resources,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def _kueue_config(
    root: Path, webhook_port: int, certs: Path, kubeconfig: Path, visibility_port: int
) -> Path:
    """Kueue's Configuration: the `pod` and `batch/job` integrations, its webhook server on
    loopback with the cluster's serving certificate (no in-cluster cert rotation: there is
    no Service to name), its visibility API server on loopback, no leader election (one
    replica)."""
    conf = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{_free_port()}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # Who submitted a job, and what it is, from its labels onto its Workload (the
        # gateway's Kueue mode shows them: kubeapi/workloads.py); and the request of
        # ours a holder's pod was made for (the gateway binds the two: kueue_engine.py).
        "integrations": {
            "frameworks": ["batch/job", "pod"],
            "labelKeysToCopy": [
                "gpuaas.jupyter.org/user",
                "gpuaas.jupyter.org/kind",
                "gpuaas.jupyter.org/request",
            ],
        },
        "managedJobsNamespaceSelector": SYSTEM_NAMESPACES_OUT,
        "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": visibility_port},
    }
    path = root / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


# The CRDs Kueue needs at its start: its own, and the ProvisioningRequest, without which
# it leaves its provisioning admission check off.
KUEUE_NEEDS = (
    "workloads.kueue.x-k8s.io",
    "topologies.kueue.x-k8s.io",
    "provisioningrequests.autoscaling.x-k8s.io",
)
SYSTEM_NAMESPACES_OUT = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "kueue-system"],
        }
    ]
}


# Kueue v0.19 reads its metrics server's certificate from this fixed path whenever it does not
# rotate its own certificates (cmd/kueue/main.go), metrics server on or off: its internal
# rotation cannot serve here, as it names the webhooks' certificate after a Service's DNS
# name and the API server reaches them by URL on 127.0.0.1. Its visibility API server reads
# its own from /visibility, as fixed (pkg/visibility/server.go `certDir`).
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
KUEUE_VISIBILITY_CERTS = Path("/visibility")


def _kueue_fixed_cert(where: Path, cn: str) -> None:
    """Put a self-signed certificate where Kueue insists on one (no cluster's own: it
    outlives them), or say why Kueue cannot start."""
    if (where / "tls.crt").exists() and (where / "tls.key").exists():
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "3650",
                "-subj",
                f"/CN={cn}",
                "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
                "-keyout",
                str(where / "tls.key"),
                "-out",
                str(where / "tls.crt"),
            ],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(
            f"cluster: Kueue v0.19 needs a certificate in {where} and it cannot be"
            f" written ({e}); create that directory, writable by you, and run again"
        ) from e


def _kueue_visibility(port: int) -> list[dict[str, Any]]:
    """Kueue's visibility API (`pendingworkloads` of a ClusterQueue or LocalQueue) through
    the aggregation layer, on loopback. The aggregator reaches an APIService through a
    Service; with aggregator routing off it resolves the Service itself
    (k8s.io/apiserver pkg/util/proxy `ResolveCluster`), and an ExternalName Service
    resolves to https://<externalName>:<the APIService's port>, so `localhost` reaches
    Kueue's visibility server here, where Endpoints on loopback are refused. The server's
    certificate is self-signed (insecureSkipTLSVerify, as Kueue's own APIService)."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "visibility-server", "namespace": "kueue-system"},
        "spec": {"type": "ExternalName", "externalName": "localhost"},
    }
    return [service] + [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{version}.visibility.kueue.x-k8s.io"},
            "spec": {
                "group": "visibility.kueue.x-k8s.io",
                "version": version,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "insecureSkipTLSVerify": True,
                "service": {"name": "visibility-server", "namespace": "kueue-system", "port": port},
            },
        }
        for version in ("v1beta1", "v1beta2")
    ]


def _url_webhooks(objects: list[dict[str, Any]], port: int, ca: str) -> Iterator[dict[str, Any]]:
    """Kueue's webhook configurations and CRDs with each `service:` reference turned into
    `url: https://127.0.0.1:<port><path>` (no Services, no cluster network here)."""
    for obj in objects:
        if obj.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            obj["metadata"]["name"] = "kueue-" + obj["metadata"]["name"]
            for hook in obj.get("webhooks") or []:
                path = hook["clientConfig"]["service"].get("path", "/")
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
                groups = {g for r in hook.get("rules") or [] for g in r.get("apiGroups", [])}
                if "kueue.x-k8s.io" not in groups:
                    # What config/components/webhook/kustomization.yaml adds to the
                    # integrations' webhooks: the control plane's own pods stay out.
                    hook["namespaceSelector"] = SYSTEM_NAMESPACES_OUT
        yield obj


def _converted_crds(crd_dir: Path) -> set[str]:
    """The CRDs that Kueue converts by webhook: those whose `webhook_in_*.yaml` patch its
    crd/kustomization.yaml enables. Only their v1beta2 types are conversion hubs; the
    others (ResourceFlavor, WorkloadPriorityClass, ...) have the same fields in both versions
    and keep the default `None` strategy, and a webhook asked to convert them fails
    ("*v1beta2.ResourceFlavor is not convertible to *v1beta1.ResourceFlavor"): the API
    server's watch cache of the v1beta1 version then logs that error and lists again, over
    and over, for as long as the cluster runs."""
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    names = set()
    for patch in kustomization.get("patches") or []:
        path = patch.get("path", "") if isinstance(patch, dict) else str(patch)
        if Path(path).name.startswith("webhook_in_"):
            names.add(yaml.safe_load((crd_dir / path).read_text())["metadata"]["name"])
    return names


def _kueue_manifests(port: int, ca: str) -> list[dict[str, Any]]:
    src = modcache("kueue", "sigs.k8s.io/kueue") / "config" / "components"
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}
    ]
    converted = _converted_crds(src / "crd")
    for f in sorted((src / "crd" / "bases").glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if crd["metadata"]["name"] in converted:
            # What config/components/crd/patches/webhook_in_*.yaml adds, by URL.
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": f"https://127.0.0.1:{port}/convert", "caBundle": ca},
                },
            }
        objects.append(crd)
    webhooks = list(yaml.safe_load_all((src / "webhook" / "manifests.yaml").read_text()))
    objects.extend(_url_webhooks([w for w in webhooks if w], port, ca))
    return objects


def _shell_named(root: Path, name: str) -> Path:
    """/bin/sh under another name: kwokctl names a component's log after its binary."""
    link = root / "wrappers" / name
    link.parent.mkdir(exist_ok=True)
    if not link.is_symlink():
        link.symlink_to("/bin/sh")
    return link


def _kwokctl_config(c: Cluster, binaries: Path, apiserver_port: int, kueue: list[str]) -> Path:
    ca = c.workdir / "pki" / "ca.crt"
    conf: dict[str, Any] = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            # Every port from the kernel, not kwokctl's countdown from 32767, which two
            # clusters started at once (a test session beside `make cluster-up`) share.
            "kubeApiserverPort": apiserver_port,
            "etcdPort": _free_port(),
            "etcdPeerPort": _free_port(),
            "kubeControllerManagerPort": _free_port(),
            "kubeSchedulerPort": _free_port(),
            "kwokControllerPort": _free_port(),
            "kubeApiserverBinary": str(binaries / "kube-apiserver"),
            "kubeControllerManagerBinary": str(binaries / "kube-controller-manager"),
            "kubeSchedulerBinary": str(binaries / "kube-scheduler"),
            "kwokControllerBinary": str(binaries / "kwok"),
            "etcdBinary": str(binaries / "etcd"),
            "kubectlBinary": str(binaries / "kubectl"),
            "kubeAuthorization": True,
            "kubeAdmission": True,
            "bindAddress": "127.0.0.1",
            # A pod's log through the API server (`kubectl logs`, the job runner): KWOK
            # serves it from the file a ClusterLogs object names for the pod's container.
            "enableCRDs": ["ClusterLogs"],
        },
        "componentsPatches": [
            {
                # The aggregation layer (Kueue's visibility API): the front proxy's client
                # certificate (kwokctl's admin cert) is trusted by the CA it is signed by.
                "name": "kube-apiserver",
                "extraArgs": [
                    {"key": "requestheader-client-ca-file", "value": str(ca)},
                    {"key": "requestheader-username-headers", "value": "X-Remote-User"},
                    {"key": "requestheader-group-headers", "value": "X-Remote-Group"},
                    {"key": "requestheader-extra-headers-prefix", "value": "X-Remote-Extra-"},
                    # The aggregator resolves an APIService's Service itself (ExternalName
                    # to loopback: _kueue_visibility), not through its endpoints.
                    {"key": "enable-aggregator-routing", "value": "false"},
                    {"key": "service-cluster-ip-range", "value": "10.96.0.0/16"},
                    # Node watches served from etcd, not the watch cache: a watch resumed
                    # from a revision etcd has compacted gets 410 Gone, as on a cluster
                    # whose cache window has passed (test_inventory makes it on cue).
                    {"key": "watch-cache-sizes", "value": "nodes#0"},
                ],
            },
            # One replica of each, and kwokctl's binary runtime restarts none: with leader
            # election on, a controller manager or scheduler that cannot renew its lease in
            # time (an API server slowed by a loaded host) exits for good, and namespaces
            # stop being deleted, Jobs stop making pods (seen under a load average of 13).
            {
                "name": "kube-controller-manager",
                "extraArgs": [{"key": "leader-elect", "value": "false"}],
            },
            {"name": "kube-scheduler", "extraArgs": [{"key": "leader-elect", "value": "false"}]},
            {
                # KWOK plays the Nodes with its annotation (every Node of kwok_node), not
                # all of them: a Node without it keeps the status a test patches into it
                # (NotReady), as a kubelet's own report.
                "name": "kwok-controller",
                "extraArgs": [
                    {"key": "manage-all-nodes", "value": "false", "override": True},
                    {
                        "key": "manage-nodes-with-annotation-selector",
                        "value": "kwok.x-k8s.io/node=fake",
                    },
                ],
            },
        ],
        "components": [
            {
                # kwokctl starts every component before it applies anything, and its
                # binary runtime restarts none; Kueue exits when its CRDs are missing, so a
                # shell waits for them (up() applies them) and then becomes Kueue (exec:
                # the same PID, which kwokctl stops).
                "name": "kueue",
                "binary": str(_shell_named(c.root, "kueue")),
                "links": ["kube-apiserver"],
                "workDir": str(c.workdir),
                "args": [
                    "-c",
                    'until "$0" wait --for=condition=Established --timeout=2s '
                    + " ".join(f"crd/{n}" for n in KUEUE_NEEDS)
                    + " >/dev/null 2>&1;"
                    ' do sleep 0.5; done; exec "$@"',
                    str(binaries / "kubectl"),
                    str(binaries / "kueue"),
                    *kueue,
                ],
                "envs": [
                    {"name": "NAMESPACE", "value": "kueue-system"},
                    {"name": "KUBECONFIG", "value": str(c.workdir / "kubeconfig.yaml")},
                ],
            }
        ],
    }
    # KWOK hands pods IPs from a loopback range, so that where a test needs a pod's process
    # (a user's server, a kernel), a local process bound to that IP plays its container.
    kwok = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        # A KwokConfiguration given replaces kwokctl's defaults: the rest are KWOK's own.
        "options": {
            "cidr": POD_CIDR,
            "nodeIP": "127.0.0.1",
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
            # KWOK's kubelet endpoints (the logs of ClusterLogs), which the API server
            # reaches on loopback at the Node's kubelet port.
            "enableDebuggingHandlers": True,
        },
    }
    path = c.root / "kwokctl.yaml"
    path.write_text(yaml.safe_dump_all([conf, kwok]))
    return path


def up(root: Path, *, timeout: float = 120.0) -> Cluster:
    """Start the cluster in `root` (build what is missing first); ready when it returns."""
    started = time.monotonic()
    binaries = build()
    c = Cluster(root.resolve())
    if (c.workdir / "kwok.yaml").exists():
        down(root)
    c.root.mkdir(parents=True, exist_ok=True)
    c.bin.mkdir(exist_ok=True)
    for b in binaries.iterdir():
        link = c.bin / b.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(b)

    webhook_port = _free_port()
    certs = c.root / "kueue-certs"
    certs.mkdir(exist_ok=True)
    pki = c.workdir / "pki"
    for name, src in (("tls.crt", "admin.crt"), ("tls.key", "admin.key"), ("ca.crt", "ca.crt")):
        if not (certs / name).is_symlink():
            (certs / name).symlink_to(pki / src)
    visibility_port = _free_port()
    kueue_conf = _kueue_config(c.root, webhook_port, certs, c.kubeconfig, visibility_port)
    _kueue_fixed_cert(KUEUE_METRICS_CERTS, "kueue-metrics")
    _kueue_fixed_cert(KUEUE_VISIBILITY_CERTS, "kueue-visibility")
    kueue_args = [
        f"--config={kueue_conf}",
        f"--kubeconfig={c.workdir / 'kubeconfig.yaml'}",
        "--zap-log-level=2",
    ]
    kwokctl_conf = _kwokctl_config(c, binaries, _free_port(), kueue_args)

    kwok = modcache("kwok", "sigs.k8s.io/kwok") / "kustomize" / "stage"
    # KWOK's own stage sets, as their kustomizations list them: nodes Ready at once, pods
    # Running, and Job pods Succeeded after their `pod-complete.stage.kwok.x-k8s.io/delay`.
    stages = [
        d / name
        for d in (kwok / "node" / "fast", kwok / "pod" / "general")
        for name in yaml.safe_load((d / "kustomization.yaml").read_text())["resources"]
    ]
    say(f"starting the control plane in {c.root} (kwokctl, binary runtime)")
    cmd = [
        str(binaries / "kwokctl"),
        "create",
        "cluster",
        "--name",
        CLUSTER_NAME,
        "--config",
        str(kwokctl_conf),
        "--kubeconfig",
        str(c.kubeconfig),
        "--wait",
        f"{int(timeout)}s",
        "--quiet-pull",
    ]
    for s in stages:
        cmd += ["--config", str(s)]
    proc = subprocess.run(cmd, env=c.env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"kwokctl create cluster failed:\n{proc.stdout}\n{proc.stderr}\n" + c.log_tail()
        )
    ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
    c.apply([kwok_node(n, **spec) for n, spec in NODES.items()])
    c.apply(_kueue_manifests(webhook_port, ca))
    c.apply(_kueue_visibility(visibility_port))
    # The ProvisioningRequest CRD (the scale-up path), from the autoscaler's apis module
    # Kueue pins.
    apis = modcache("kueue", "k8s.io/autoscaler/cluster-autoscaler/apis")
    c.kubectl(
        "apply",
        "--server-side",
        "-f",
        str(apis / "config" / "crd" / "autoscaling.x-k8s.io_provisioningrequests.yaml"),
    )
    keda = modcache("", KEDA[0], KEDA[1]) / "config" / "crd" / "bases"
    c.kubectl("apply", "--server-side", "-f", str(keda / "keda.sh_scaledobjects.yaml"))
    c.kubectl("wait", "--for=condition=Ready", "node", "--all", f"--timeout={int(timeout)}s")
    _wait_kueue(c, timeout)
    say(f"ready in {time.monotonic() - started:.1f} s: export KUBECONFIG={c.kubeconfig}")
    return c


def _wait_kueue(c: Cluster, timeout: float) -> None:
    """Kueue serves its webhooks: a dry-run ResourceFlavor goes through them."""
    deadline = time.monotonic() + timeout
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "readiness-probe"},
    }
    last = ""
    while time.monotonic() < deadline:
        try:
            c.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(flavor))
            return
        except RuntimeError as e:
            last = str(e)
            time.sleep(0.5)
    raise RuntimeError(
        f"Kueue's webhooks did not answer in {timeout:.0f} s: {last}\n" + c.log_tail()
    )


def down(root: Path) -> None:
    """Stop every component of the cluster in `root` (kwokctl stops them by their PIDs)."""
    c = Cluster(root.resolve())
    kwokctl = c.bin / "kwokctl"
    if not (c.workdir / "kwok.yaml").exists() or not kwokctl.exists():
        say(f"no cluster in {c.root}")
        return
    proc = subprocess.run(
        [
            str(kwokctl),
            "delete",
            "cluster",
            "--name",
            CLUSTER_NAME,
            "--kubeconfig",
            str(c.kubeconfig),
        ],
        env=c.env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kwokctl delete cluster failed:\n{proc.stdout}\n{proc.stderr}")
    say("stopped")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["bin", "up", "down", "logs"])
    parser.add_argument("--dir", type=Path, default=ROOT / ".cluster")
    args = parser.parse_args()
    if args.command == "bin":
        print(build())
    elif args.command == "up":
        up(args.dir)
    elif args.command == "down":
        down(args.dir)
    else:
        print(Cluster(args.dir.resolve()).log_tail())


if __name__ == "__main__":
    main()
