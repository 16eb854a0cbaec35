"""Live views of GPU jobs and of the gateway's status, for notebooks.

Two layers, so the state machine is tested without a browser:

- `JobView` and `StatusView` (in `jobs/views.py`): pure models, from the server's JSON (and
  the clock) to the fields a view shows: headline, log tail, links, error, whether it is over;
- `JobWidget` and `StatusWidget` (here): ipywidgets that display those fields and refresh them.

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
import threading
import time
from typing import Any

from jupyter_gpuaas.jobs.views import WIDGET_CLASS, JobView, StatusView

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


def last_lines(text: str, lines: int, cut: bool) -> str:
    """The last `lines` lines of a log's tail. `cut`: the tail was read from the middle of
    the log (its first line is likely a fragment, dropped)."""
    kept = text.splitlines()
    if cut and len(kept) > 1:
        kept = kept[1:]
    return "\n".join(kept[-lines:])


class JobWidget:
    """A job's live view: headline, the log's tail while it runs, links when it ends, a
    cancel button while it can be cancelled.

    The tail is the last `tail_lines` lines (what the box shows without scrolling), read
    from the last `tail_bytes` of the log: a box showing the top of a longer tail would
    show old lines while the job writes new ones."""

    def __init__(self, client: Any, job: dict[str, Any], interval: float = 1.0,
                 tail_bytes: int = 4000, tail_lines: int = 12) -> None:  # fmt: skip
        import ipywidgets as w  # type: ignore[import-untyped]

        self.client = _quiet(client)
        self.job = job
        self.tail_bytes = tail_bytes
        self.tail_lines = tail_lines
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
                cut = len(tail.encode("utf-8", "replace")) >= self.tail_bytes
                tail = last_lines(tail, self.tail_lines, cut)
        except Exception as e:
            self.header.value = f"<span style='color:#d32f2f'>{html.escape(str(e))}</span>"
            return False
        view = JobView.from_job(self.job, log_tail=tail)
        self.render(view)
        return view.done

    def render(self, view: JobView) -> None:
        self.header.value = view.html()
        style = "margin:0;overflow-x:auto"  # tail_lines long: all of it shows, unscrolled
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
