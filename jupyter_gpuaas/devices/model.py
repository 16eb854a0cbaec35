"""What the gateway knows of GPUs: nodes, devices, live samples, and the Inventory interface.

The inventories themselves live beside this module: `NvmlInventory` (nvml.py) reads this
machine's GPUs through NVML, `SimulatedInventory` (simulated.py) invents nodes for the demo
and tests, and `parse_devices_spec` (spec.py) builds one from a `--devices` spec. This
package is on the ground floor: it imports no web framework and nothing of the package
above it, so the gateway, the single-user server and the command line can all use it.

A device is identified by its `uuid` (`GPU-…`, or `MIG-…` for a MIG instance), which is
what a launcher should name in `CUDA_VISIBLE_DEVICES`: a device's `index` is its position
within its node, and on a host with several models (one node per flavor) positions restart
at 0 per node, so an index alone can name another model's GPU. Simulated devices have no
UUID (`""`): nothing real can be named, and launchers fall back to the indices.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("jupyter_gpuaas.devices")

GiB = 1024**3
MiB = 1024**2

SLUG_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU (or MIG instance) as the admission core sees it: a device index on a node
    of a flavor, and the UUID a launcher names it by.

    `uuid` is NVML's (`GPU-…`, `MIG-…`), or "" where there is none (simulated devices).
    A MIG instance also carries its `mig_profile` (`1g.10gb`) and its GPU's `parent_uuid`.
    """

    node: str
    index: int
    flavor: str
    model: str
    uuid: str
    memory_total: int  # bytes
    mig_profile: str = ""
    parent_uuid: str = ""


@dataclass
class DeviceSample:
    """One reading of one GPU.

    `temperature` and `power` are None where the device does not report them (NVML's
    NotSupported), rather than a made-up zero that a dashboard would plot as real.
    `processes` maps host PIDs seen on the device to their utilization (0..1); a PID that
    holds a context but was idle in the last window shows with 0.0.
    """

    node: str
    index: int
    utilization: float  # 0..1
    memory_used: int  # bytes
    temperature: float | None  # °C
    power: float | None  # W
    healthy: bool
    processes: dict[int, float] = field(default_factory=dict)
    error: str = ""  # why the device is unhealthy, for the log and the devices page


@dataclass(frozen=True)
class NodeInfo:
    name: str
    flavor: str
    gpus: int


def slugify(text: str) -> str:
    """A label-safe name: lower case, [a-z0-9-], no leading or trailing dash."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "gpu"


# Words in NVML model names that say nothing about which pool a GPU belongs to.
_MODEL_NOISE = re.compile(
    r"^(nvidia|tesla|geforce|quadro|generation|pcie|sxm\d*|nvl|hbm\d*e?|\d+gb|\d+g|oam)$"
)


def flavor_from_model(model: str) -> str:
    """Derive a flavor slug from an NVML model name.

    "NVIDIA H200" → "h200", "NVIDIA A100-SXM4-80GB" → "a100", "Tesla T4" → "t4",
    "NVIDIA H100 80GB HBM3" → "h100", "NVIDIA GeForce RTX 4090" → "rtx-4090". Memory size
    and form factor are dropped on purpose: a flavor is what a user asks for, and an
    80 GB A100 next to a 40 GB one is a distinction to make with `nvml:flavor=` if it
    matters.
    """
    words = [w for w in re.split(r"[\s_\-/]+", model.lower()) if w]
    kept = [w for w in words if not _MODEL_NOISE.match(w)]
    return slugify("-".join(kept))


_MIG_PROFILE_RE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb([+-][a-z0-9]+)*$")


def mig_flavor(gpu_flavor: str, profile: str) -> str:
    """The flavor of a MIG instance: its GPU's flavor, `-mig-`, and the profile.

    "a100" and "1g.10gb" → "a100-mig-1g.10gb", the name NVIDIA's own tools and the
    Kubernetes device plugin's `nvidia.com/mig-1g.10gb` resource use, so an administrator
    recognises it. A "+me" profile suffix becomes "-me", keeping names label-safe.
    """
    profile = profile.strip().lower().replace("+", "-")
    if not _MIG_PROFILE_RE.match(profile):
        raise ValueError(f"bad MIG profile {profile!r}: expected e.g. 1g.10gb")
    return f"{gpu_flavor}-mig-{profile}"


class Inventory:
    """Nodes and devices the gateway may grant, plus live samples of them."""

    simulated: bool = False
    message: str = ""

    def nodes(self) -> list[NodeInfo]:
        raise NotImplementedError

    def devices(self) -> list[DeviceInfo]:
        raise NotImplementedError

    def sample(self) -> list[DeviceSample]:
        raise NotImplementedError

    def add_node(self, flavor: str, gpus: int | None = None, name: str | None = None) -> NodeInfo:
        raise NotImplementedError(f"{type(self).__name__} cannot add nodes: only simulated ones")

    def remove_node(self, name: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot remove nodes: only simulated ones")

    def close(self) -> None:
        """Release the library handle, if any. Safe to call twice."""

    def uuids(self, node: str, indices: Iterable[int]) -> list[str] | None:
        """The UUIDs of these devices of `node`, in order, or None where any of them has
        none (simulated devices, or a device this inventory no longer has).

        The gateway puts them in a grant, so launchers can name the exact devices.
        """
        by_key = {(d.node, d.index): d.uuid for d in self.devices() if d.node == node}
        out = [by_key.get((node, i), "") for i in indices]
        return out if all(out) else None

    def to_json(self, samples: Iterable[DeviceSample] | None = None) -> dict[str, Any]:
        """The shape of `jupyter-gpuaas devices --json` (and a base for `GET api/devices`)."""
        by_key = {(s.node, s.index): s for s in (samples or ())}
        devices = []
        for d in self.devices():
            entry: dict[str, Any] = asdict(d)
            s = by_key.get((d.node, d.index))
            if s is not None:
                entry.update(
                    utilization=s.utilization,
                    memory_used=s.memory_used,
                    temperature=s.temperature,
                    power=s.power,
                    healthy=s.healthy,
                    processes={str(pid): u for pid, u in s.processes.items()},
                    error=s.error,
                )
            devices.append(entry)
        return {
            "simulated": self.simulated,
            "message": self.message,
            "nodes": [asdict(n) for n in self.nodes()],
            "devices": devices,
        }


# --- attribution -----------------------------------------------------------------------


@dataclass
class Attribution:
    """What the devices say about one request's activity."""

    request_id: Hashable
    user: str
    tenant: str
    devices: list[tuple[str, int]]
    utilization: float  # max device utilization over its devices (0..1)
    process_seen: bool  # any of its PIDs shows on any of its devices
    process_utilization: float | None  # max utilization of its own PIDs, None if unseen


Holder = tuple[Hashable, str, str, Iterable[int]]


def attribute(
    samples: Iterable[DeviceSample], holders: Mapping[tuple[str, int], Holder]
) -> dict[Hashable, Attribution]:
    """Per request: its max utilization and whether its processes show on its devices.

    `holders` maps (node, index) → (request_id, user, tenant, pids). Grants are exclusive,
    so a device's utilization is its holder's; `process_seen` tells the idle policy that a
    kernel still holds a context even while its utilization is zero. A device without a
    sample (gone, or not sampled yet) contributes nothing.
    """
    by_key = {(s.node, s.index): s for s in samples}
    out: dict[Hashable, Attribution] = {}
    for key, (request_id, user, tenant, pids) in holders.items():
        a = out.get(request_id)
        if a is None:
            a = out[request_id] = Attribution(request_id, user, tenant, [], 0.0, False, None)
        a.devices.append(key)
        s = by_key.get(key)
        if s is None:
            continue
        a.utilization = max(a.utilization, s.utilization)
        for pid in pids:
            if pid in s.processes:
                a.process_seen = True
                a.process_utilization = max(a.process_utilization or 0.0, s.processes[pid])
    return out
