"""Kubernetes side of jupyter-gpuaas, on the hub/server floor (ARCHITECTURE.md).

- `pods.py`: a grant applied to a pod manifest (QueuedKubeSpawner's pods, the jobs' pods);
- `nodes.py`: the cluster's GPU Nodes, listed and watched (the `--devices kubernetes`
  inventory's source, which the gateway loads by name);
- `scaleup.py`: placeholders, KEDA ScaledObjects and ProvisioningRequests, built and, for
  the gateway's cluster scalers, created and removed;
- `jobs.py`: batch jobs as Kubernetes Jobs (`KubernetesJobRunner`);
- `kernels.py`, `kernel_pods.py`, `kernel_launcher.py`: GPU kernels in pods of their own
  (the `gpuaas-kubernetes` kernel provisioner, on gateway_provisioners');
- `meta.py`, `manifests.py`, `cli.py`: `jupyter-gpuaas kubernetes manifests`;
- `monitoring.py`: the Prometheus scrape job of the gateway replicas (a token file).

Every object is built by a pure function from plain values and tested by dict equality
(the way KubeSpawner's objects.py builds its pods). This package never imports `gateway`
or `sim` (an import-linter contract): the gateway's adapters (gateway/cluster.py) load
what they need from here by dotted name, as they load scalers.
"""
