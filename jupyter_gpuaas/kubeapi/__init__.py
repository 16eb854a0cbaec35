"""The Kubernetes API objects the gateway itself reads and writes, on the floor below it
(ARCHITECTURE.md), so that the gateway imports them as it imports the core:

- `nodes.py`: the cluster's GPU Nodes, listed and watched (the `--devices kubernetes`
  inventory's source, gateway/cluster.py `ClusterInventory`);
- `scaleup.py`: placeholders, KEDA ScaledObjects and ProvisioningRequests, built and, for
  the gateway's cluster scalers (gateway/cluster.py), created and removed;
- `meta.py`: the names, labels, settings and flavors every deployment object shares.
- `workloads.py`: Kueue's Workloads as the gateway's Kueue mode reads them;
- `connect.py`: the API client, the pod's own namespace and the resumable watch that every
  part of jupyter-gpuaas on a cluster uses.

Pure builders and thin API clients (kubernetes_asyncio, imported where it is called); this
package imports only the core's model and the version, never the gateway or anything above.
"""
