"""`jupyter-gpuaas devices`: this machine's GPUs as the gateway would see them.

Registered by `jupyter_gpuaas.cli` through `add_parser` and `run`. It builds the same
inventory the gateway builds from the same `--devices` spec, takes one sample and prints
it, so "why does the gateway see no GPUs?" has a one-command answer. Each device shows the
UUID a launch environment names it by (none for simulated devices) and, for a MIG
instance, its own flavor (`a100-mig-1g.10gb`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .model import GiB, Inventory
from .spec import parse_devices_spec


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "devices",
        help="list this machine's GPUs as the gateway would see them",
        description="List nodes and GPUs (model, UUID, memory, utilization, temperature, "
        "power, health) as the gateway's inventory sees them, with one live sample. GPUs in "
        "MIG mode are listed as their MIG instances, each of its own flavor.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--devices",
        default=os.environ.get("GPUAAS_DEVICES", "nvml"),
        metavar="SPEC",
        help="nvml (default), nvml:flavor=NAME, or simulated:FLAVOR=NODESxGPUS[,…] "
        "(default from $GPUAAS_DEVICES)",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        inventory = parse_devices_spec(args.devices)
    except ValueError as e:
        print(f"jupyter-gpuaas devices: {e}", file=sys.stderr)
        return 2
    try:
        samples = inventory.sample()
        if args.json:
            print(json.dumps(inventory.to_json(samples), indent=2))
        else:
            print(format_table(inventory, samples))
    finally:
        inventory.close()
    return 0


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def format_table(inventory: Inventory, samples: list[Any]) -> str:
    by_key = {(s.node, s.index): s for s in samples}
    header = ("NODE", "GPU", "FLAVOR", "MODEL", "UUID", "MEMORY", "UTIL", "TEMP", "POWER", "HEALTH")
    rows: list[tuple[str, ...]] = []
    for d in inventory.devices():
        s = by_key.get((d.node, d.index))
        total = d.memory_total / GiB
        ident = (d.node, str(d.index), d.flavor, d.model, d.uuid or "-")
        if s is None:
            rows.append((*ident, f"{total:.0f} GiB", "-", "-"))
            continue
        rows.append(
            (
                *ident,
                f"{s.memory_used / GiB:.1f}/{total:.0f} GiB",
                f"{s.utilization:.0%}",
                _fmt(s.temperature, "{:.0f}°C"),
                _fmt(s.power, "{:.0f} W"),
                "ok" if s.healthy else f"FAIL {s.error}".strip(),
            )
        )
    lines = []
    if rows:
        widths = [
            max(len(r[i]) if i < len(r) else 0 for r in [header, *rows]) for i in range(len(header))
        ]
        for r in [header, *rows]:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip())
    lines.append(inventory.message)
    return "\n".join(lines)
