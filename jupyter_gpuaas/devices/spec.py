"""`--devices SPEC`: which inventory the gateway (and `jupyter-gpuaas devices`) builds.

`parse_devices_spec` is the one entry point; every inventory it returns implements
`Inventory` (model.py).
"""

from __future__ import annotations

import re

from .model import SLUG_RE, Inventory
from .nvml import NvmlInventory
from .simulated import SimulatedInventory

_SHAPE_RE = re.compile(r"^(\d+)x(\d+)$")


def parse_devices_spec(spec: str) -> Inventory:
    """`nvml`, `nvml:flavor=a100[,node=NAME]` or `simulated:a100=2x4,t4=1x8`.

    Raises ValueError with a one-line message naming what is wrong and what is expected.
    """
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind == "nvml":
        opts: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or key not in ("flavor", "node") or not value:
                raise ValueError(f"bad nvml option {item!r}: expected flavor=NAME or node=NAME")
            if not SLUG_RE.match(value):
                raise ValueError(f"bad {key} {value!r}: use lower case letters, digits and -")
            opts[key] = value
        return NvmlInventory(flavor=opts.get("flavor"), node=opts.get("node"))
    if kind == "simulated":
        shapes: dict[str, tuple[int, int]] = {}
        items = [p.strip() for p in rest.split(",") if p.strip()]
        if not items:
            raise ValueError("simulated needs flavors, e.g. simulated:a100=2x4,t4=1x8")
        for item in items:
            flavor, eq, shape = (s.strip() for s in item.partition("="))
            m = _SHAPE_RE.match(shape)
            if not eq or not m:
                raise ValueError(
                    f"bad simulated flavor {item!r}: expected FLAVOR=NODESxGPUS, e.g. a100=2x4"
                )
            if not SLUG_RE.match(flavor):
                raise ValueError(f"bad flavor {flavor!r}: use lower case letters, digits and -")
            if flavor in shapes:
                raise ValueError(f"flavor {flavor!r} given twice in {spec!r}")
            nodes, gpus = int(m.group(1)), int(m.group(2))
            if gpus < 1:
                raise ValueError(f"flavor {flavor!r} needs at least 1 GPU per node")
            shapes[flavor] = (nodes, gpus)
        return SimulatedInventory(shapes)
    raise ValueError(
        f"bad devices spec {spec!r}: expected nvml, nvml:flavor=NAME or "
        "simulated:FLAVOR=NODESxGPUS[,…]"
    )
