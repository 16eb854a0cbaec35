"""Kubernetes side of jupyter-gpuaas, on its own floor between hub and server
(ARCHITECTURE.md).

- `pods.py`: a grant applied to a pod manifest (QueuedKubeSpawner's pods, the jobs' pods);
- `jobs.py`: batch jobs as Kubernetes Jobs (`KubernetesJobRunner`);
- `kernels.py`, `kernel_pods.py`, `kernel_launcher.py`: GPU kernels in pods of their own
  (the `gpuaas-kubernetes` kernel provisioner, on gateway_provisioners');
- `manifests.py`, `cli.py`: `jupyter-gpuaas kubernetes manifests` (from kubeapi/'s
  `meta.py` and `scaleup.py`, the objects the gateway itself drives);
- `monitoring.py`: the Prometheus scrape job of the gateway replicas (a token file).

Every object is built by a pure function from plain values and tested by dict equality
(the way KubeSpawner's objects.py builds its pods). This package never imports `gateway`
or `sim` (an import-linter contract); it imports `server` (the kernel provisioner) and
`jobs` (the Job runner) below it.
"""
