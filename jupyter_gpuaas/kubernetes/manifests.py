"""What an admin applies to run the gateway on a cluster: PURE builders of every object.

`manifests(config, flavors, settings)` returns the documents of
`jupyter-gpuaas kubernetes manifests` as plain dicts (the CLI prints them as YAML):

- a ServiceAccount, a ClusterRole for the Node inventory (get, list, watch: nothing else),
  and a Role in the namespace only when the chosen scale-up needs one;
- the users' servers' ServiceAccount (`jupyter-gpuaas-singleuser`, z2jh's
  `singleuser.serviceAccountName`) and a Role with only what their GPU kernel pods (and,
  when chosen, their Kubernetes Jobs) need;
- the gateway Deployment: two replicas electing a leader on the PostgreSQL store
  (`--leader-election=on`, gateway/leader.py), each advertising its pod IP; the standby
  answers reads and forwards changes, so both are Ready (`api/health` answers 200 on
  either) and a rolling update is safe (the fence refuses a deposed leader's writes);
  its Service, and a PodDisruptionBudget keeping one up;
- the Prometheus scrape job for the replicas (`monitoring.py`: a Hub token with the
  view scope read from a file, not an open route);
- a ConfigMap with the quota file and the gateway's config (the flavors' node selectors);
  the database URL comes from a Secret the admin creates (PostgreSQL is the store here);
- the scale-up objects, as chosen (`scaleup.py`).

Every object carries `app.kubernetes.io/name: jupyter-gpuaas` (INTERFACES.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jupyter_gpuaas.kubeapi.meta import (
    CONFIG_DIR,
    HEALTH_PATH,
    NAME,
    PORT,
    SCALE_UPS,
    SERVICE_PREFIX,
    ClusterFlavor,
    ManifestError,
    Settings,
    labels,
    meta,
    selector_labels,
)
from jupyter_gpuaas.kubeapi.scaleup import scale_up_objects

from .monitoring import scrape_config_map

# --------------------------------------------------------------------- access


def service_account(settings: Settings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(NAME, "gateway", settings),
    }


def rules(
    scale_up: str, admission: str = "core"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(cluster rules, namespace rules): only the verbs the gateway uses.

    The Node inventory lists and watches Nodes (cluster-scoped). The ProvisioningRequest
    scaler creates and deletes its requests and their PodTemplates, and lists them to
    adopt those an earlier leader made; the placeholder scaler
    patches its Deployments' replicas through the scale subresource. KEDA scales the
    placeholders itself: the gateway then needs nothing in the namespace. In Kueue mode
    (`admission` kueue) the gateway watches the namespace's Workloads, reads a LocalQueue's
    ClusterQueue and lists pods (the node a job's pod is bound to), asks the visibility
    API for a ClusterQueue's pending Workloads (cluster-scoped), and ends a job for a
    cancel or release through its API: it deletes a pod of Kueue's pod integration and
    deactivates any other job's Workload (patch).
    """
    cluster = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    namespaced: list[dict[str, Any]] = []
    if scale_up == "provisioning-request":
        namespaced = [
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
        ]
    elif scale_up == "placeholders":
        namespaced = [
            {
                "apiGroups": ["apps"],
                "resources": ["deployments/scale"],
                "verbs": ["patch"],
            }
        ]
    if admission == "kueue":
        cluster = [
            *cluster,
            {
                "apiGroups": ["visibility.kueue.x-k8s.io"],
                "resources": ["clusterqueues/pendingworkloads"],
                "verbs": ["get"],
            },
        ]
        namespaced = [
            *namespaced,
            {
                "apiGroups": ["kueue.x-k8s.io"],
                "resources": ["workloads"],
                "verbs": ["get", "list", "watch", "patch"],
            },
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
        ]
    return cluster, namespaced


def access(settings: Settings) -> list[dict[str, Any]]:
    cluster, namespaced = rules(settings.scale_up, settings.admission)
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": settings.namespace}]
    # A ClusterRole is cluster-wide; its name says whose namespace's gateway it serves.
    cluster_name = f"{NAME}-{settings.namespace}-nodes"
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta(cluster_name, "gateway", settings, namespaced=False),
            "rules": cluster,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta(cluster_name, "gateway", settings, namespaced=False),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": cluster_name,
            },
            "subjects": subject,
        },
    ]
    if namespaced:
        docs += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": meta(NAME, "gateway", settings),
                "rules": namespaced,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": meta(NAME, "gateway", settings),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
                "subjects": subject,
            },
        ]
    return docs


# --------------------------------------------------------------------- the users' servers

#: The ServiceAccount of the users' servers (z2jh: `singleuser.serviceAccountName`).
SINGLEUSER = f"{NAME}-singleuser"
SINGLEUSER_ACCESS = ("kernels", "kernels-and-jobs", "none")


def singleuser_rules(what: str) -> list[dict[str, Any]]:
    """What a user's server does with the API, in its own namespace: only those verbs.

    GPU kernels in pods of their own (`gpuaas-kubernetes`, kernels.py) create the kernel
    pod, read it (and the server's own pod, for its volumes) and delete it. Batch jobs as
    Kubernetes Jobs (KubernetesJobRunner, jobs.py) create, list and delete Jobs, list their
    pods and read the pods' logs.
    """
    if what == "none":
        return []
    pods = ["create", "get", "delete"]
    if what == "kernels":
        return [{"apiGroups": [""], "resources": ["pods"], "verbs": pods}]
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": [*pods, "list"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "list", "delete"]},
    ]


def singleuser_access(settings: Settings) -> list[dict[str, Any]]:
    """The users' servers' ServiceAccount, its Role and RoleBinding (none with `none`)."""
    rules_ = singleuser_rules(settings.singleuser_access)
    if not rules_:
        return []
    subject = [{"kind": "ServiceAccount", "name": SINGLEUSER, "namespace": settings.namespace}]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta(SINGLEUSER, "singleuser", settings),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(SINGLEUSER, "singleuser", settings),
            "rules": rules_,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(SINGLEUSER, "singleuser", settings),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": SINGLEUSER,
            },
            "subjects": subject,
        },
    ]


# --------------------------------------------------------------------- the gateway


def gateway_config(flavors: Sequence[ClusterFlavor], settings: Settings) -> dict[str, Any]:
    """The gateway's traitlets config (JSON) for the cluster: inventory and scaler."""
    config: dict[str, Any] = {
        "ClusterInventory": {"flavors": {f.name: f.inventory_json() for f in flavors}}
    }
    if settings.scale_up in ("provisioning-request", "placeholders"):
        config["ClusterScaler"] = {
            "namespace": settings.namespace,
            "provisioning_class": settings.provisioning_class,
            "flavors": {
                f.name: {**f.inventory_json(), "gpus_per_node": f.gpus_per_node}
                for f in flavors
                if f.growth > 0
            },
        }
    if settings.admission == "kueue":
        config["GatewayApp"] = {"admission": "kueue", "kueue_namespace": settings.namespace}
    return config


def config_map(flavors: Sequence[ClusterFlavor], settings: Settings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(NAME, "gateway", settings),
        "data": {
            "quotas.yaml": settings.quotas_text,
            "gpuaas_config.json": json.dumps(gateway_config(flavors, settings), indent=2) + "\n",
        },
    }


SCALER_ARG = {
    "keda": "prometheus",
    "none": "none",
    "provisioning-request": "jupyter_gpuaas.gateway.cluster.ProvisioningRequestScaler",
    "placeholders": "jupyter_gpuaas.gateway.cluster.PlaceholderScaler",
}


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


# The login cookie's key (HubOAuth) must be the same on both replicas, or a browser
# signed in through one is signed out by the other. It lives in the hub Secret (key
# `cookie-secret`); the gateway refuses a key file others may read, and a Secret volume's
# files are root's, so an init container copies it, mode 0600, into a memory volume.
COOKIE_SECRET_KEY = "cookie-secret"
SECRET_DIR = "/etc/jupyter-gpuaas-secret"
RUN_DIR = "/run/jupyter-gpuaas"
COPY_SECRET = (
    "import os, sys\n"
    "data = open(sys.argv[1], 'rb').read()\n"
    "fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
    "os.write(fd, data)\n"
    "os.close(fd)\n"
)
SECURE = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def cookie_secret_copier(settings: Settings) -> dict[str, Any]:
    """The init container that puts the shared cookie key where the gateway reads it."""
    return {
        "name": "cookie-secret",
        "image": settings.image,
        "command": [
            "python3",
            "-c",
            COPY_SECRET,
            f"{SECRET_DIR}/{COOKIE_SECRET_KEY}",
            f"{RUN_DIR}/cookie_secret",
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": SECURE,
        "volumeMounts": [
            {"name": "secret", "mountPath": SECRET_DIR, "readOnly": True},
            {"name": "run", "mountPath": RUN_DIR},
        ],
    }


def deployment(settings: Settings) -> dict[str, Any]:
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "timeoutSeconds": 5}
    container = {
        "name": "gateway",
        "image": settings.image,
        "command": ["jupyter-gpuaas"],
        "args": [
            "gateway",
            "--ip=0.0.0.0",
            f"--port={PORT}",
            f"--quotas={CONFIG_DIR}/quotas.yaml",
            f"--config={CONFIG_DIR}/gpuaas_config.json",
            "--devices=kubernetes",
            f"--scaler={SCALER_ARG[settings.scale_up]}",
            # Kubernetes expands $(VAR) from the container's env: the URL stays in the Secret.
            "--db-url=$(GPUAAS_DB_URL)",
            f"--cookie-secret-file={RUN_DIR}/cookie_secret",
            # Replicas elect a leader on the store; a standby names (and forwards to) the
            # leader by the URL it advertises: its pod's own address, not the Service's.
            "--leader-election=on",
            f"--advertise-url=http://$(POD_IP):{PORT}{SERVICE_PREFIX}",
        ],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            _secret_env("GPUAAS_DB_URL", settings.db_secret, "url"),
            {"name": "JUPYTERHUB_SERVICE_NAME", "value": "gpuaas"},
            {"name": "JUPYTERHUB_SERVICE_PREFIX", "value": SERVICE_PREFIX},
            {"name": "JUPYTERHUB_API_URL", "value": settings.hub_api_url},
            _secret_env("JUPYTERHUB_API_TOKEN", settings.hub_token_secret, "token"),
            {"name": "JUPYTERHUB_CLIENT_ID", "value": "service-gpuaas"},
            {"name": "JUPYTERHUB_OAUTH_CALLBACK_URL", "value": SERVICE_PREFIX + "oauth_callback"},
        ],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        # Ready: the store answers. A standby is Ready too: it answers reads from its
        # mirror and forwards changes to the leader, so the Service may send it anything.
        # Live: the same route, given two minutes of store trouble before a restart (a
        # restart rebuilds the queue from the store anyway).
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {
            **probe,
            "initialDelaySeconds": 15,
            "periodSeconds": 20,
            "failureThreshold": 6,
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": SECURE,
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "run", "mountPath": RUN_DIR, "readOnly": True},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(NAME, "gateway", settings),
        "spec": {
            # A leader and a standby: when the leader's pod goes (a drain, a crash), the
            # standby takes the lock within seconds and restores the queue from the store.
            # A rollout adds the new pod before removing an old one: two gateways at once
            # are safe, one decides and every write is fenced on the lock (leader.py).
            "replicas": 2,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "selector": {"matchLabels": selector_labels("gateway")},
            "template": {
                "metadata": {
                    # z2jh's hub network policy admits pods with this label: the
                    # gateway calls the Hub's API (users, groups, stopping servers).
                    "labels": {
                        **labels("gateway", settings),
                        "hub.jupyter.org/network-access-hub": "true",
                    },
                    # No prometheus.io/scrape annotations: that job scrapes without a
                    # token and `metrics` answers it 401; see monitoring.py's job.
                },
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    # Leader and standby on different nodes where the cluster can.
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {
                                            "matchLabels": selector_labels("gateway")
                                        },
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        }
                    },
                    "initContainers": [cookie_secret_copier(settings)],
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": NAME}},
                        {
                            "name": "secret",
                            "secret": {
                                "secretName": settings.hub_token_secret,
                                "items": [{"key": COOKIE_SECRET_KEY, "path": COOKIE_SECRET_KEY}],
                            },
                        },
                        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    ],
                },
            },
        },
    }


def service(settings: Settings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(NAME, "gateway", settings),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels("gateway"),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def disruption_budget(settings: Settings) -> dict[str, Any]:
    # Of the two replicas, one stays through a drain: a node drain evicts one pod at a
    # time, and the other (leader, or standby taking over) keeps the queue answering.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(NAME, "gateway", settings),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": selector_labels("gateway")}},
    }


def manifests(flavors: Sequence[ClusterFlavor], settings: Settings) -> list[dict[str, Any]]:
    """Every document, in the order `kubectl apply` needs (config before its users)."""
    if settings.scale_up not in SCALE_UPS:
        raise ManifestError(
            f"--scale-up: {settings.scale_up!r} is not one of {', '.join(SCALE_UPS)}"
        )
    if settings.singleuser_access not in SINGLEUSER_ACCESS:
        raise ManifestError(
            f"--singleuser-access: {settings.singleuser_access!r} is not one of "
            f"{', '.join(SINGLEUSER_ACCESS)}"
        )
    docs = [service_account(settings), *access(settings), *singleuser_access(settings)]
    docs.append(config_map(flavors, settings))
    docs += [deployment(settings), service(settings), disruption_budget(settings)]
    docs.append(scrape_config_map(settings))
    docs += scale_up_objects(flavors, settings)
    return docs
