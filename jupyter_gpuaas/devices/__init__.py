"""The GPU inventory: nodes and devices the gateway may grant, and their live samples.

Ground floor (beside `admission/` and `client.py`): no web framework, nothing of the
package above it. The gateway builds its inventory here, the single-user server samples
its kernels' GPUs with it, and `jupyter-gpuaas devices` (cli.py) prints what it sees.

- model.py: `DeviceInfo`, `DeviceSample`, `NodeInfo`, the `Inventory` interface,
  flavor names, and `attribute` (which request's processes use which device)
- nvml.py: `NvmlInventory`, this machine's GPUs and MIG instances through NVML
- simulated.py: `SimulatedInventory`, invented nodes for the demo and tests
- spec.py: `parse_devices_spec`, a `--devices` spec to an inventory
"""

from .model import (
    Attribution,
    DeviceInfo,
    DeviceSample,
    GiB,
    Inventory,
    MiB,
    NodeInfo,
    attribute,
    flavor_from_model,
    mig_flavor,
    slugify,
)
from .nvml import NvmlInventory
from .simulated import SimulatedInventory
from .spec import parse_devices_spec

__all__ = [
    "Attribution",
    "DeviceInfo",
    "DeviceSample",
    "GiB",
    "Inventory",
    "MiB",
    "NodeInfo",
    "NvmlInventory",
    "SimulatedInventory",
    "attribute",
    "flavor_from_model",
    "mig_flavor",
    "parse_devices_spec",
    "slugify",
]
