"""Live views of GPU jobs and of the gateway's status, for notebooks.

Two layers, so the state machine is tested without a browser:

- `JobView` and `StatusView`: pure models, from the server's JSON (and the clock) to the
  fields a view shows: headline, log tail, links, error, whether it is over;
- `JobWidget` and `StatusWidget`: ipywidgets that display those fields and refresh them.

How they stay current: by polling the server (`/gpuaas/jobs/{id}`, `/logs?tail=`, and the
`/gpuaas/api/*` proxy) from a daemon thread, every `interval` seconds, until the job ends.
Not the gateway's events: a job's state lives in the server's JobManager (starting,
running, exit status), not in the gateway; the log tail needs a poll anyway; and one
long-lived SSE connection per widget per kernel would outlive forgotten cells. A poll a
second per live job view is cheap, stops by itself, and survives a server restart.

A refresh is not activity: the polls ask the server not to count them
(`no_track_activity`), and the widgets carry the `WIDGET_CLASS` DOM class, by which the
server extension keeps their comm updates out of the kernel's activity (server/activity.py).
A kernel that only shows `%gpu status` is idle, and is culled on time.
"""

from __future__ import annotations

import html
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpuaas.words import format_duration, plural, usage_sentence_of

#: The DOM class of our live widgets: the server extension ignores their comm traffic.
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
            f"{free} of {total} GPUs free on {len(nodes)} node(s){sim}",
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
            if r.get("state") in ("queued", "admitted", "parked", "culled")
        ]  # fmt: skip
        lines.append(f"your live requests: {len(live)}")
        for r in live:
            pos = r.get("position") or {}
            at = f" position {pos.get('overall')} of {pos.get('of')}" if pos else ""
            why = (r.get("waiting_for") or {}).get("message")
            lines.append(
                f"  {r.get('id')} {r.get('kind')} {r.get('gpus')}× {r.get('flavor') or 'any'} "
                f"({r.get('tenant')}): {r.get('state')}{at}" + (f"; {why}" if why else "")
            )
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


# ---------------------------------------------------------------------- ipywidgets


class _Poller:
    """Calls `step()` every `interval` seconds on a daemon thread until it returns True
    (done) or `stop()`; errors are shown by `step` itself and retried."""

    def __init__(self, step: Any, interval: float) -> None:
        self.step = step
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpuaas-widget")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.step():
                    return
            except Exception:
                pass
            self._stop.wait(self.interval)


class JobWidget:
    """A job's live view: headline, the log's tail while it runs, links when it ends, a
    cancel button while it can be cancelled."""

    def __init__(self, client: Any, job: dict[str, Any], interval: float = 1.0,
                 tail_bytes: int = 2000) -> None:  # fmt: skip
        import ipywidgets as w  # type: ignore[import-untyped]

        self.client = _quiet(client)
        self.job = job
        self.tail_bytes = tail_bytes
        self.header = w.HTML(_dom_classes=[WIDGET_CLASS])
        self.log = w.HTML(_dom_classes=[WIDGET_CLASS])
        self.cancel_button = w.Button(description="Cancel", button_style="warning")
        self.cancel_button.on_click(self._cancel)
        self.box = w.VBox([w.HBox([self.header, self.cancel_button]), self.log])
        self.render(JobView.from_job(job))
        self.poller = _Poller(self.refresh, interval)
        if not JobView.from_job(job).done:
            self.poller.start()

    def refresh(self) -> bool:
        try:
            self.job = self.client.job(self.job["id"])
            tail = ""
            if self.job.get("state") != "queued":
                tail = self.client.logs(self.job["id"], tail=self.tail_bytes)
        except Exception as e:
            self.header.value = f"<span style='color:#d32f2f'>{html.escape(str(e))}</span>"
            return False
        view = JobView.from_job(self.job, log_tail=tail)
        self.render(view)
        return view.done

    def render(self, view: JobView) -> None:
        self.header.value = view.html()
        style = "max-height:12em;overflow:auto;margin:0"
        tail = html.escape(view.log_tail)
        self.log.value = f"<pre style='{style}'>{tail}</pre>" if view.log_tail else ""
        self.cancel_button.layout.display = "none" if view.done else None

    def _cancel(self, _: Any) -> None:
        try:
            self.job = self.client.cancel(self.job["id"])
        except Exception as e:
            self.header.value += f"<br><span style='color:#d32f2f'>{html.escape(str(e))}</span>"
        self.refresh()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)  # type: ignore[no-untyped-call]


class StatusWidget:
    """`%gpu status` in JupyterLab: the same lines, refreshed every `interval` seconds
    for `duration` seconds (then it says how old it is: no kernel polls forever)."""

    def __init__(self, client: Any, interval: float = 5.0, duration: float = 600.0) -> None:
        import ipywidgets as w

        self.client = _quiet(client)
        self.until = time.monotonic() + duration
        self.body = w.HTML(_dom_classes=[WIDGET_CLASS])
        self.refresh()
        self.poller = _Poller(self.refresh, interval)
        self.poller.start()

    def refresh(self) -> bool:
        try:
            view = StatusView.from_status(self.client.status())
            text = view.text()
        except Exception as e:
            text = f"gpuaas: {e}"
        over = time.monotonic() >= self.until
        stamp = time.strftime("%H:%M:%S")
        note = f"as of {stamp}" + ("; no longer refreshing: run %gpu status again" if over else "")
        self.body.value = f"<pre style='margin:0'>{html.escape(text)}\n({note})</pre>"
        return over

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.body)  # type: ignore[no-untyped-call]


def _quiet(client: Any) -> Any:
    """The client for refreshes: its polls do not count as the server's activity."""
    quiet = getattr(client, "quiet", None)
    return quiet() if callable(quiet) else client
