"""Pure views of GPU jobs and of the gateway's status: from the server's JSON (and the clock)
to the fields a view shows: headline, log tail, links, error, whether it is over.

Shared by the shell (`jupyter-gpuaas jobs`, `submit`), the `%gpu` magics and the widgets of
`notebook/widgets.py`; pure, so a shell command never imports ipywidgets and the state
machine is tested without a browser.
"""

from __future__ import annotations

import html
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas.words import ending_sentence, format_duration, plural, usage_sentence_of

#: The DOM class of our live widgets (notebook/widgets.py): the server extension ignores
#: their comm traffic, so a refresh never counts as the kernel's activity
#: (server/activity.py).
WIDGET_CLASS = "jupyter-gpuaas-live"

#: Colour per job state (the Jupyter palette's).
COLOURS = {
    "queued": "#ef6c00",
    "starting": "#1976d2",
    "running": "#1976d2",
    "succeeded": "#388e3c",
    "failed": "#d32f2f",
    "cancelled": "#616161",
}


@dataclass
class JobView:
    """What a job's view shows, for one job record at one instant."""

    id: str
    state: str
    title: str
    headline: str
    colour: str
    log_tail: str = ""
    links: list[tuple[str, str]] = field(default_factory=list)  # (label, path)
    error: str | None = None
    done: bool = False

    @classmethod
    def from_job(cls, job: dict[str, Any], now: float | None = None, log_tail: str = "") -> JobView:
        now = time.time() if now is None else now
        state = str(job.get("state"))
        what = f"{job.get('gpus')}× {job.get('flavor') or 'GPU'} for {job.get('tenant')}"
        grant = job.get("grant") or {}
        where = ""
        if grant:
            devices = ",".join(str(d) for d in grant.get("devices") or [])
            where = f" on {grant.get('node')} (GPU {devices})"
        error = None
        links: list[tuple[str, str]] = []
        if state == "queued":
            pos = job.get("position") or {}
            headline = f"queued for {what}"
            if pos:
                headline = f"queued: position {pos.get('overall')} of {pos.get('of')} for {what}"
            if job.get("reason"):
                headline += f" ({job['reason']})"
        elif state == "starting":
            headline = f"admitted{where}, starting"
        elif state == "running":
            started = job.get("started") or now
            headline = f"running for {format_duration(now - started)}{where}"
        else:
            took = ""
            if job.get("started") and job.get("ended"):
                took = f" after {format_duration(job['ended'] - job['started'])}"
            if state == "succeeded":
                headline = f"succeeded{took}"
            elif state == "cancelled":
                headline = f"cancelled{took}"
                error = job.get("reason")
            else:
                headline = f"failed{took}: {job.get('reason') or 'unknown error'}"
                error = str(job.get("reason") or "unknown error")
            if job.get("output_notebook") and state != "cancelled":
                links.append(("executed notebook", str(job["output_notebook"])))
            if job.get("log"):
                links.append(("log", str(job["log"])))
            if job.get("outdir"):
                links.append(("outputs", str(job["outdir"])))
        return cls(
            id=str(job.get("id")),
            state=state,
            title=f"GPU job {job.get('name') or job.get('kind')} ({job.get('id')})",
            headline=headline,
            colour=COLOURS.get(state, "#616161"),
            log_tail=log_tail if state not in ("queued",) else "",
            links=links,
            error=error,
            done=state in ("succeeded", "failed", "cancelled"),
        )

    def text(self) -> str:
        lines = [f"{self.title}: {self.headline}"]
        lines += [f"  {label}: {path}" for label, path in self.links]
        return "\n".join(lines)

    def html(self, relative_to: str | None = None) -> str:
        """Header and links; links relative to the notebook (the kernel's cwd), which is
        how JupyterLab opens a file from a link in an output."""
        base = relative_to or os.getcwd()
        parts = [
            f"<b>{html.escape(self.title)}</b> "
            f"<span style='color:{self.colour}'>{html.escape(self.headline)}</span>"
        ]
        if self.links:
            anchors = []
            for label, path in self.links:
                try:
                    href = os.path.relpath(path, base)
                except ValueError:
                    href = path
                anchors.append(
                    f"<a href='{html.escape(href)}' target='_blank'>{html.escape(label)}</a>"
                )
            parts.append(" · ".join(anchors))
        return "<br>".join(parts)


ENDED_STATES = ("finished", "cancelled", "rejected", "preempted", "culled")
RECENTLY_ENDED = 3  # `%gpu status` lists this many ended requests, newest first
_KERNEL_ID = re.compile(r"\s*\([0-9a-f]{6,}\)$")


@dataclass
class StatusView:
    """What `%gpu status` shows: me, my tenants' quota and usage, devices, my requests."""

    lines: list[str]

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> StatusView:
        me = status.get("me") or {}
        devices = status.get("devices") or {}
        nodes = devices.get("nodes") or []
        sim = " (SIMULATED devices)" if devices.get("simulated") else ""
        free = sum(int(n.get("free") or 0) for n in nodes)
        total = sum(int(n.get("gpus") or 0) for n in nodes)
        mine = set(me.get("tenants") or [])
        lines = [
            f"{free} of {total} GPUs free on {plural(len(nodes), 'node')}{sim}",
            f"you are {me.get('name')}; tenants you may charge: "
            f"{', '.join(sorted(mine)) or 'none'}",
        ]
        for t in (status.get("tenants") or {}).get("tenants") or []:
            if mine and t.get("name") not in mine:
                continue
            for u in t.get("usage") or []:
                more = int(u.get("pending_gpus") or 0)
                waiting = f"; {plural(more, 'more GPU')} waiting" if more else ""
                lines.append(f"  {usage_sentence_of(str(t.get('name')), u)}{waiting}")
        for n in nodes:
            lines.append(f"  node {n.get('name')}: {n.get('flavor')}, "
                         f"{n.get('free')} of {n.get('gpus')} free")  # fmt: skip
        live = [
            r for r in status.get("requests") or []
            if r.get("state") in ("queued", "admitted", "parked")
        ]  # fmt: skip
        lines.append(f"your live requests: {len(live)}")
        for r in live:
            pos = r.get("position") or {}
            at = f" position {pos.get('overall')} of {pos.get('of')}" if pos else ""
            why = (r.get("waiting_for") or {}).get("message")
            # By name and in words (issue 45: "r9 kernel 1× any (vision)" read as jargon).
            name = _KERNEL_ID.sub("", str(r.get("name") or ""))
            label = f"{name} ({r.get('kind')})" if name else str(r.get("kind"))
            gpus = int(r.get("gpus") or 0)
            what = plural(gpus, f"{r['flavor']} GPU" if r.get("flavor") else "GPU")
            lines.append(
                f"  {label}: {what} for {r.get('tenant')}, {r.get('state')}{at}"
                + (f"; {why}" if why else "")
            )
        # How the last few ended, one sentence each: who or what ended it, and why.
        ended = sorted(
            (r for r in status.get("requests") or [] if r.get("state") in ENDED_STATES),
            key=lambda r: float(r.get("updated") or 0),
            reverse=True,
        )[:RECENTLY_ENDED]
        if ended:
            lines.append("recently ended:")
        for r in ended:
            # A kernel's request is named "GPU 1 (f7df35bd)": the name, not the kernel id.
            name = _KERNEL_ID.sub("", str(r.get("name") or "")) or r.get("kind")
            lines.append(f"  {name}: {ending_sentence(r)}")
        jobs = status.get("jobs") or []
        active = [j for j in jobs if j.get("state") in ("queued", "starting", "running")]
        lines.append(f"your jobs: {len(active)} active, {len(jobs) - len(active)} ended")
        return cls(lines)

    def text(self) -> str:
        return "\n".join(self.lines)


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return "no GPU jobs yet"
    rows = [("ID", "STATE", "KIND", "NAME", "GPUS", "TENANT", "AGE")]
    now = time.time()
    for j in jobs:
        rows.append((
            str(j["id"]), str(j["state"]), str(j["kind"]), str(j.get("name") or ""),
            str(j["gpus"]), str(j["tenant"]), format_duration(now - float(j["created"])),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
