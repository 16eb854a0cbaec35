"""The job view's state machine and the widgets that show it, without a browser."""

from __future__ import annotations

import time
from typing import Any

from helpers import wait_for

from jupyter_gpuaas.jobs.views import JobView, StatusView, format_jobs
from jupyter_gpuaas.notebook.widgets import JobWidget

T0 = 1_700_000_000.0


def job(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "r1", "kind": "notebook", "name": "train.ipynb", "tenant": "vision", "gpus": 2,
        "flavor": "a100", "state": "queued", "position": {"overall": 3, "of": 7},
        "created": T0, "started": None, "ended": None, "reason": None, "grant": None,
        "outdir": "/home/a/gpu-jobs/r1", "log": "/home/a/gpu-jobs/r1/output.log",
        "output_notebook": "/home/a/gpu-jobs/r1/train.ipynb",
    }  # fmt: skip
    base.update(kw)
    return base


def test_queued_running_succeeded() -> None:
    v = JobView.from_job(job())
    assert (v.state, v.done, v.links, v.log_tail) == ("queued", False, [], "")
    assert v.headline == "queued: position 3 of 7 for 2× a100 for vision"
    assert v.title == "GPU job train.ipynb (r1)"

    v = JobView.from_job(job(state="starting", position=None,
                             grant={"node": "n1", "devices": [2, 3]}))  # fmt: skip
    assert v.headline == "admitted on n1 (GPU 2,3), starting"

    running = job(state="running", position=None, started=T0,
                  grant={"node": "n1", "devices": [2, 3]})  # fmt: skip
    v = JobView.from_job(running, now=T0 + 65, log_tail="epoch 1\n")
    assert v.headline == "running for 1 min on n1 (GPU 2,3)"
    assert v.log_tail == "epoch 1\n" and not v.done and v.colour == "#1976d2"

    v = JobView.from_job({**running, "state": "succeeded", "ended": T0 + 3700}, log_tail="ok")
    assert v.done and v.error is None and v.headline == "succeeded after 1 h 2 min"
    assert [label for label, _ in v.links] == ["executed notebook", "log", "outputs"]
    assert "succeeded after 1 h 2 min" in v.text() and "executed notebook: /home/a" in v.text()
    assert "href='gpu-jobs/r1/train.ipynb'" in v.html(relative_to="/home/a")


def test_failed_and_cancelled() -> None:
    reason = "exited with status 1: cell 2 raised KeyError: 'x'"
    v = JobView.from_job(job(state="failed", started=T0, ended=T0 + 5, reason=reason))
    assert v.done and v.colour == "#d32f2f"
    assert v.headline == "failed after 5 s: exited with status 1: cell 2 raised KeyError: 'x'"
    assert v.error == "exited with status 1: cell 2 raised KeyError: 'x'"
    v = JobView.from_job(job(state="cancelled", reason="cancelled while queued"))
    assert v.done and v.headline == "cancelled" and v.error == "cancelled while queued"
    assert [label for label, _ in v.links] == ["log", "outputs"]
    v = JobView.from_job(job(reason="preempted; queued again"))
    assert v.headline.endswith("(preempted; queued again)")


def test_listing() -> None:
    assert format_jobs([]) == "no GPU jobs yet"
    table = format_jobs([job(created=time.time() - 5)])
    assert table.splitlines()[0].split() == ["ID", "STATE", "KIND", "NAME", "GPUS", "TENANT", "AGE"]
    assert table.splitlines()[1].split()[:6] == ["r1", "queued", "notebook", "train.ipynb", "2",
                                                 "vision"]  # fmt: skip


def test_status_view() -> None:
    status = {
        "me": {"name": "alice", "tenants": ["vision"]},
        "devices": {"simulated": True, "nodes": [{"name": "n1", "flavor": "a100", "gpus": 4,
                                                  "free": 1}]},
        "tenants": {"tenants": [
            {"name": "vision", "usage": [{"flavor": "a100", "quota": 4, "admitted": 3,
                                          "parked": 0, "borrowed": 0, "pending_gpus": 2}]},
            {"name": "nlp", "usage": [{"flavor": "a100", "quota": 2, "admitted": 0,
                                       "parked": 0, "borrowed": 0, "pending_gpus": 0}]},
        ]},
        "requests": [{"id": "r9", "kind": "kernel", "gpus": 1, "flavor": None, "tenant": "vision",
                      "name": "GPU 1 (f7df35bd)", "state": "queued",
                      "position": {"overall": 1, "of": 2}}],
        "jobs": [job(), job(id="r2", state="failed")],
    }  # fmt: skip
    text = StatusView.from_status(status).text()
    assert "1 of 4 GPUs free on 1 node (SIMULATED devices)" in text
    assert "  vision uses 3 of its 4 a100; 2 more GPUs waiting" in text and "nlp " not in text
    # By its name, in words: no request id, no "1× any".
    assert "  GPU 1 (kernel): 1 GPU for vision, queued position 1 of 2" in text
    assert "r9" not in text and "×" not in text
    assert "your jobs: 1 active, 1 ended" in text


class FakeClient:
    """The server as the widget sees it: a job that runs, then succeeds."""

    def __init__(self, states: list[dict[str, Any]]) -> None:
        self.states = states
        self.cancelled = False

    def job(self, job_id: str) -> dict[str, Any]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def logs(self, job_id: str, tail: int | None = None) -> str:
        return "step 1\nstep 2\n"

    def cancel(self, job_id: str) -> dict[str, Any]:
        self.cancelled = True
        self.states = [job(state="cancelled", reason="cancelled while queued")]
        return self.states[0]


def test_job_widget_follows_the_job_and_stops_polling() -> None:
    running = job(state="running", position=None, started=time.time(),
                  grant={"node": "n1", "devices": [0]})  # fmt: skip
    done = {**running, "state": "succeeded", "ended": time.time()}
    client = FakeClient([running, done])
    w = JobWidget(client, job(), interval=0.05)
    wait_for(lambda: "succeeded" in w.header.value, 5, "the widget to show the job's end",
             interval=0.02)  # fmt: skip
    assert "succeeded" in w.header.value and "executed notebook" in w.header.value
    assert "step 2" in w.log.value
    assert w.cancel_button.layout.display == "none"
    w.poller._thread.join(2)
    assert not w.poller._thread.is_alive()  # no poll after the end


def test_job_widget_cancel_button() -> None:
    client = FakeClient([job()])
    w = JobWidget(client, job(), interval=10)
    assert "queued: position 3 of 7" in w.header.value and w.log.value == ""
    w.cancel_button.click()
    assert client.cancelled and "cancelled" in w.header.value
    w.poller.stop()
