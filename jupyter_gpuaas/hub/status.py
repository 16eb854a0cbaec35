"""What a queued spawn shows: its status, and the board that streams it to progress().

The spawn task (waiting for GPUs) publishes; any number of progress streams (the pending
page in several tabs, the REST progress endpoint) read. Each reader gets the latest status
at once and then every later one; a reader that falls behind skips to the newest, because
only the current place in the queue matters.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas.words import about, plural, usage_sentence_of

from .options import GpuOptions


@dataclass(frozen=True)
class QueueStatus:
    phase: str  # queued | admitted | skipped (gpus: 0) | failed
    options: GpuOptions
    request: Mapping[str, Any] = field(default_factory=dict)
    usage: list[dict[str, Any]] = field(default_factory=list)
    simulated: bool = False
    reason: str = ""
    # failed: `reason` is the request's ending sentence, which the Hub says (spawner.py).
    ended: bool = False


class StatusBoard:
    def __init__(self) -> None:
        self._status: QueueStatus | None = None
        self._version = 0
        self._changed = asyncio.Event()

    def reset(self) -> None:
        self._status = None

    @property
    def phase(self) -> str | None:
        """The last status's phase (queued, admitted, skipped, failed), None before one."""
        return None if self._status is None else self._status.phase

    def publish(self, status: QueueStatus) -> None:
        self._status = status
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def updates(self) -> AsyncIterator[QueueStatus]:
        seen = -1
        while True:
            if self._status is not None and self._version != seen:
                seen = self._version
                yield self._status
                continue
            await self._changed.wait()


def _gpus_text(options: GpuOptions, flavor: str | None) -> str:
    kind = flavor or options.flavor or "GPU"
    return f"{options.gpus}× {kind}"


def progress_event(status: QueueStatus) -> dict[str, Any]:
    """A JupyterHub progress event; `gpuaas` carries the machine-readable details."""
    o = status.options
    req = status.request
    detail: dict[str, Any] = {
        "phase": status.phase,
        "request": req.get("id"),
        "tenant": o.tenant,
        "gpus": o.gpus,
        "flavor": o.flavor,
        "usage": status.usage,
        "simulated": status.simulated,
    }
    if status.phase == "skipped":
        return {"progress": 40, "message": "No GPU asked for: starting at once", "gpuaas": detail}
    if status.phase == "failed":
        detail["reason"] = status.reason
        return {
            "progress": 100,
            "message": f"GPU request failed: {status.reason}",
            "gpuaas": detail,
        }
    if status.phase == "admitted":
        grant = req.get("grant") or {}
        devices = ",".join(str(d) for d in grant.get("devices") or [])
        detail["grant"] = grant
        sim = " (simulated devices)" if status.simulated else ""
        return {
            "progress": 40,
            "message": f"GPUs granted: {_gpus_text(o, grant.get('flavor'))} on "
            f"{grant.get('node')}, devices {devices}{sim}. Starting the server…",
            "gpuaas": detail,
        }
    pos = req.get("position") or {}
    detail["position"] = pos.get("tenant")
    detail["position_overall"] = pos.get("overall")
    detail["queued"] = pos.get("of")
    wait = req.get("estimated_wait") or {}
    detail["estimated_wait"] = wait.get("seconds")
    parts = [f"Queued for {_gpus_text(o, None)} (team {o.tenant})"]
    if pos:
        parts.append(
            f"position {pos.get('tenant')} of {pos.get('tenant_of')} in the team, "
            f"{pos.get('overall')} of {pos.get('of')} overall"
        )
    waiting_for = req.get("waiting_for") or {}
    why = waiting_for.get("message")
    for u in status.usage:
        if o.flavor in (None, u.get("flavor")) and waiting_for.get("kind") != "quota":
            parts.append(usage_sentence_of(str(o.tenant), u))  # a quota wait says it itself
    if why:
        parts.append(str(why))  # "waiting: all 4 a100 are in use; the next one frees …"
    elif wait.get("seconds") is not None:
        parts.append(f"estimated wait {about(float(wait['seconds']))}")
    else:
        parts.append("no estimate yet")
    scaling = req.get("scaling")
    if scaling:
        nodes = int(scaling.get("nodes") or 0)
        parts.append(f"{plural(nodes, str(scaling.get('flavor')) + ' node')} on the way")
    return {"progress": 10, "message": "; ".join(parts), "gpuaas": detail}
