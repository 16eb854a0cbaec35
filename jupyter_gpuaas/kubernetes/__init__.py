"""Kubernetes side of jupyter-gpuaas, on the hub/server floor (ARCHITECTURE.md).

- `pods.py`: the grant applied to a pod manifest (pure; QueuedKubeSpawner's pods);
- `manifests.py`, `scaleup.py`: what an admin applies to deploy the gateway
  (`jupyter-gpuaas kubernetes manifests`), built by pure functions;
- `cli.py`: the `kubernetes` subcommand.

Every object is built by a pure function from plain values and tested by dict equality
(the way KubeSpawner's objects.py builds its pods). This package reaches the gateway only
through `client.py`; it never imports `gateway` or `sim`.
"""
