"""The job record: what was asked, where it runs, and how it ended.

A job's id is its gateway request id, so `jupyter-gpuaas status`, the sidebar and
`%gpu jobs` all name it the same way. Its record is written as `gpu-jobs/<id>/job.json`
beside the source (the notebook, or the notebook's working directory for a cell), next to
its log and executed notebook, so the outputs explain themselves without the server.

Pure: no I/O beyond reading and writing that one JSON file, no tornado.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

#: Kinds of job: a notebook run through papermill, a cell's code run as a script, or a
#: Python script file (`jupyter-gpuaas submit train.py`).
KINDS = ("notebook", "cell", "script")

#: Waiting in the gateway's queue.
QUEUED = "queued"
#: Admitted; the process is being started (or about to be, after a restart: see manager).
STARTING = "starting"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"

STATES = (QUEUED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED)
#: States a record may be in only while a server watches it: after a restart they are
#: stale (nobody heartbeats the grant, nobody waits for the process) and become failed.
LIVE = (QUEUED, STARTING, RUNNING)
ENDED = (SUCCEEDED, FAILED, CANCELLED)

OUTPUT_DIR = "gpu-jobs"
RECORD = "job.json"
LOG = "output.log"
SCRIPT = "cell.py"


@dataclass
class Job:
    id: str
    kind: str
    tenant: str
    gpus: int
    outdir: str  # absolute: <source dir>/gpu-jobs/<id>
    cwd: str  # absolute working directory of the job's process
    name: str = ""
    flavor: str | None = None
    priority: int = 0
    user: str = ""
    source: str | None = None  # the notebook or script (notebook and script jobs)
    parameters: dict[str, Any] = field(default_factory=dict)
    python: str | None = None  # interpreter of a cell or script job: the submitter's
    kernel_name: str | None = None  # a notebook job's kernel; None: the notebook's own
    state: str = QUEUED
    reason: str | None = None  # why it failed or was cancelled
    exit_status: int | None = None
    position: dict[str, Any] | None = None  # the gateway's queue position while queued
    grant: dict[str, Any] | None = None  # node and devices while admitted
    created: float = field(default_factory=time.time)
    admitted: float | None = None
    started: float | None = None
    ended: float | None = None
    pid: int | None = None  # the job's process (leader of its own session)
    pid_started: float | None = None  # its start time: a reused pid is not our job

    # ------------------------------------------------------------------ paths

    @property
    def log_path(self) -> Path:
        return Path(self.outdir) / LOG

    @property
    def record_path(self) -> Path:
        return Path(self.outdir) / RECORD

    @property
    def script_path(self) -> Path:
        return Path(self.outdir) / SCRIPT

    @property
    def output_notebook(self) -> Path | None:
        """The executed copy of a notebook job, named like its source."""
        if self.kind != "notebook" or not self.source:
            return None
        return Path(self.outdir) / Path(self.source).name

    @property
    def live(self) -> bool:
        return self.state in LIVE

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["log"] = str(self.log_path)
        nb = self.output_notebook
        out["output_notebook"] = str(nb) if nb else None
        now = self.ended or time.time()
        out["elapsed"] = (now - self.started) if self.started else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self) -> None:
        """Write job.json atomically (a reader never sees half a record)."""
        path = self.record_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Job:
        return cls.from_json(json.loads(path.read_text()))

    def end(self, state: str, reason: str | None = None, exit_status: int | None = None) -> None:
        self.state = state
        self.reason = reason
        if exit_status is not None:
            self.exit_status = exit_status
        self.ended = time.time()
        self.position = None


def output_dir(source_dir: Path, job_id: str) -> Path:
    return source_dir / OUTPUT_DIR / job_id


def resolve_value(text: str) -> Any:
    """A papermill-style parameter value from the command line: int, float, True/False,
    None, else the string itself (what `papermill -p` does)."""
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if text in ("None", "none"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
