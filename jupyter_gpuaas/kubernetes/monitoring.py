"""How Prometheus scrapes the gateways on a cluster (PURE): a token, not an open route.

`GET metrics` needs a token with the view scope (auth.py). On a cluster the gateway is
the JupyterHub service `gpuaas`, so the scraper's token is a Hub token: the values file
registers a token-only service `gpuaas-metrics` whose role holds
`access:services!service=gpuaas` and `custom:gpuaas:view` (nothing else), with its token
in the Secret `jupyter-gpuaas-metrics` (key `token`). Prometheus reads the same token
from a file (`authorization.credentials_file`), the Secret mounted into its pod.

Why not `--metrics-public` behind a NetworkPolicy: the Hub's proxy routes
`/services/gpuaas/` from outside to the gateway, so a policy admitting the proxy (which it
must) would admit every outsider's `/services/gpuaas/metrics` too.

The scrape job finds the gateway's pods by their labels (every replica: the leader and
its standby), keeps their `http` port, and labels each series with its namespace and pod;
the annotations-based `kubernetes-pods` job is not used (it would scrape without a token
and record a failed target).
"""

from __future__ import annotations

from typing import Any

import yaml

from jupyter_gpuaas.kubeapi.meta import NAME, SERVICE_PREFIX, Settings, meta

#: Where the admin mounts the Secret `jupyter-gpuaas-metrics` in the Prometheus pod.
TOKEN_DIR = f"/etc/secrets/{NAME}-metrics"
METRICS_PATH = SERVICE_PREFIX + "metrics"


def scrape_config(settings: Settings) -> dict[str, Any]:
    """One Prometheus `scrape_configs` entry for the gateway pods of `settings.namespace`."""
    label = "__meta_kubernetes_pod_label_app_kubernetes_io_"
    return {
        "job_name": f"{NAME}-{settings.namespace}",
        "metrics_path": METRICS_PATH,
        "scrape_interval": "15s",
        "authorization": {
            "type": "Bearer",
            "credentials_file": f"{TOKEN_DIR}/token",
        },
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [settings.namespace]}}],
        "relabel_configs": [
            {"source_labels": [f"{label}name"], "regex": NAME, "action": "keep"},
            {"source_labels": [f"{label}component"], "regex": "gateway", "action": "keep"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": "http",
                "action": "keep",
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }


def scrape_config_text(settings: Settings) -> str:
    """The scrape job as a YAML list, for the prometheus chart's `extraScrapeConfigs`."""
    return yaml.safe_dump([scrape_config(settings)], sort_keys=False)


def scrape_config_map(settings: Settings) -> dict[str, Any]:
    """The scrape job, shipped as a ConfigMap for the admin to hand to Prometheus."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(f"{NAME}-prometheus", "gateway", settings),
        "data": {"scrape-configs.yaml": scrape_config_text(settings)},
    }
