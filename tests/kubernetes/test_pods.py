"""grant_pod, the pure pod builder of QueuedKubeSpawner: dict in, dict out, compared by
equality (no API server needed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jupyter_gpuaas.kubernetes.pods import grant_env, grant_pod, pin_to_node

FLAVORS = {
    "a100": {
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "mig": {"resource": "nvidia.com/mig-1g.10gb", "node_selector": {"pool": "mig"}},
}
# A pod as KubeSpawner builds it from a configuration that (wrongly) asks for a GPU for
# everybody: the builder must not let it through without a grant.
CONFIGURED: dict[str, Any] = {
    "metadata": {"name": "jupyter-ann", "labels": {"component": "singleuser-server"}},
    "spec": {
        "nodeSelector": {"team": "ml"},
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "containers": [
            {
                "name": "notebook",
                "image": "img",
                "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    {"name": "X", "value": "1"},
                ],
                "resources": {
                    "limits": {"nvidia.com/gpu": "1", "memory": "8Gi"},
                    "requests": {"nvidia.com/gpu": "1", "memory": "4Gi"},
                },
            },
            {
                "name": "sidecar",
                "image": "s",
                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
            },
        ],
    },
}
REQUEST = {
    "id": "r-1",
    "tenant": "vision",
    "gpus": 2,
    "grant": {"flavor": "a100", "node": "gpu-7", "devices": [0, 1]},
}


def test_a_grant_of_two_a100() -> None:
    before = copy.deepcopy(CONFIGURED)
    got = grant_pod(CONFIGURED, request=REQUEST, flavors=FLAVORS)
    assert before == CONFIGURED  # the configured pod is not touched
    assert got == {
        "metadata": {
            "name": "jupyter-ann",
            "labels": {"component": "singleuser-server"},
            "annotations": {
                "gpuaas.jupyter.org/request": "r-1",
                "gpuaas.jupyter.org/tenant": "vision",
            },
        },
        "spec": {
            "nodeSelector": {"team": "ml", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "tolerations": [
                {"key": "spot", "operator": "Exists"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": ["gpu-7"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "notebook",
                    "image": "img",
                    "env": [
                        {"name": "X", "value": "1"},
                        {"name": "GPUAAS_REQUEST_ID", "value": "r-1"},
                        {"name": "GPUAAS_TENANT", "value": "vision"},
                        {"name": "GPUAAS_FLAVOR", "value": "a100"},
                        {"name": "GPUAAS_NODE", "value": "gpu-7"},
                    ],
                    "resources": {
                        "limits": {"memory": "8Gi", "nvidia.com/gpu": "2"},
                        "requests": {"memory": "4Gi", "nvidia.com/gpu": "2"},
                    },
                },
                {"name": "sidecar", "image": "s", "resources": {"limits": {}}},
            ],
        },
    }


def test_no_grant_means_no_gpu_resource_and_void_devices() -> None:
    got = grant_pod(CONFIGURED, request=None, flavors=FLAVORS)
    expected = copy.deepcopy(CONFIGURED)
    main, side = expected["spec"]["containers"]
    main["env"] = [
        {"name": "X", "value": "1"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": ""},
    ]
    main["resources"] = {"limits": {"memory": "8Gi"}, "requests": {"memory": "4Gi"}}
    side["resources"] = {"limits": {}}
    assert got == expected
    assert grant_pod(CONFIGURED, request={"gpus": 0}, flavors=FLAVORS) == expected


def test_mig_flavor_resource_and_unpinned() -> None:
    request = {"id": "r-2", "tenant": "nlp", "gpus": 1, "grant": {"flavor": "mig", "node": "n1"}}
    got = grant_pod(CONFIGURED, request=request, flavors=FLAVORS, node_label="")
    main = got["spec"]["containers"][0]
    assert main["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/mig-1g.10gb": "1"}
    assert got["spec"]["nodeSelector"] == {"team": "ml", "pool": "mig"}
    assert got["spec"]["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert "affinity" not in got["spec"]


def test_the_pin_is_anded_into_every_configured_term() -> None:
    configured = {
        "podAntiAffinity": {"x": 1},
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}
                        ]
                    },
                ]
            }
        },
    }
    pin = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n9"]}
    assert pin_to_node(configured, "kubernetes.io/hostname", "n9") == {
        "podAntiAffinity": {"x": 1},
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, pin]},
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}
                        ],
                        "matchExpressions": [pin],
                    },
                ]
            }
        },
    }


def test_env_of_a_grant_and_of_none() -> None:
    assert grant_env(None, hide_devices=False) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert grant_env({"id": "r", "tenant": "t", "flavor": "f", "grant": {}}) == {
        "GPUAAS_REQUEST_ID": "r",
        "GPUAAS_TENANT": "t",
        "GPUAAS_FLAVOR": "f",
        "GPUAAS_NODE": "",
    }


def test_a_pod_without_containers_is_refused() -> None:
    with pytest.raises(ValueError, match="no container"):
        grant_pod({"spec": {}}, request=REQUEST, flavors=FLAVORS)
