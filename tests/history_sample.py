"""A week of a gateway's store, for the what-if how-to (docs/how-to/what-if-from-history.md).

A real week cannot be recorded in a test, so these rows are written straight into the
store's own tables (rows.py, the schema its migrations create), with the values a gateway
writes for such a week: each request's row, its admit and finish (or cancel) decisions,
and a kernel's busy/idle transitions. tests/gateway/test_history_export.py checks that a
real gateway writes rows of this shape.

vision (quota a100: 2): alice sends six 4-hour jobs at once on two mornings; they queue
behind the quota, two at a time. nlp (quota a100: 6): bob opens a kernel twice a day and
keeps it 3 hours, busy for the first half hour only, never above 15% utilization. carol
(vision) gives up on a queued kernel after an hour.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy.orm import Session

from jupyter_gpuaas.gateway.rows import ActivityRow, DecisionRow, RequestRow
from jupyter_gpuaas.gateway.store import Store


def quotas_yaml(scale: int = 1) -> str:
    """The quota file of the sample: `scale` times the GPUs and quotas (benchmarks)."""
    return (
        f"flavors:\n  a100: {{nodes: {scale}, gpus_per_node: 8}}\n"
        f"tenants:\n  vision: {{quota: {{a100: {2 * scale}}}}}\n"
        f"  nlp: {{quota: {{a100: {6 * scale}}}}}\n"
    )


QUOTAS_YAML = quotas_yaml()

H = 3600.0
DAY = 86400.0
WEEK = 7 * DAY


def _requests(weeks: int = 1, scale: int = 1) -> list[dict[str, Any]]:
    """(id, tenant, user, kind, submit, admit, end, end event, peak, busy-until) offsets;
    the week's pattern `weeks` times over, by `scale` copies of its three users."""
    out: list[dict[str, Any]] = []
    n = 0

    def add(**r: Any) -> None:
        nonlocal n
        n += 1
        out.append(dict(id=f"r-{n:04d}", **r))

    for w in range(weeks):
        for k in range(scale):
            me = "" if k == 0 else str(k)
            at = w * WEEK
            for day in (1, 3):
                for i in range(6):
                    submit = at + day * DAY + 9 * H
                    admit = submit + (i // 2) * 4 * H  # two at a time: vision's quota
                    add(tenant="vision", user=f"alice{me}", kind="job", submit=submit,
                        admit=admit, end=admit + 4 * H, event="finish", peak=0.92,
                        idle_at=None)  # fmt: skip
            for day in range(6):
                for hour in (10, 15):
                    submit = at + day * DAY + hour * H
                    add(tenant="nlp", user=f"bob{me}", kind="kernel", submit=submit,
                        admit=submit, end=submit + 3 * H, event="finish", peak=0.15,
                        idle_at=submit + 0.5 * H)  # fmt: skip
            submit = at + 3 * DAY + 9 * H + 300
            add(tenant="vision", user=f"carol{me}", kind="kernel", submit=submit, admit=None,
                end=submit + H, event="cancel", peak=None, idle_at=None)  # fmt: skip
    return out


def write_sample_store(
    db_url: str, now: float | None = None, *, weeks: int = 1, scale: int = 1
) -> int:
    """The week (or `weeks` of them, by `scale` copies of its users) ending at `now` (whole
    seconds) into a new store; the number of requests."""
    end_of_week = float(int(now if now is not None else time.time()))
    base = end_of_week - weeks * WEEK
    rows = _requests(weeks, scale)
    store = Store.open(db_url)
    try:
        with Session(store.engine) as s, s.begin():
            for r in rows:
                submit, end = base + r["submit"], base + r["end"]
                admit = base + r["admit"] if r["admit"] is not None else None
                state = "finished" if r["event"] == "finish" else "cancelled"
                s.add(RequestRow(id=r["id"], tenant=r["tenant"], user=r["user"],
                                 kind=r["kind"], gpus=1, flavor="a100", state=state,
                                 submit_time=submit, queue_time=submit,
                                 assigned_flavor="a100" if admit else None,
                                 first_admit=admit, admit_time=admit,
                                 peak_utilization=r["peak"], created=submit,
                                 updated=end))  # fmt: skip
                if admit is not None:
                    fields = {"tenant": r["tenant"], "flavor": "a100", "gpus": 1}
                    s.add(DecisionRow(t=admit, event="admit", request_id=r["id"],
                                      fields=json.dumps(fields)))  # fmt: skip
                s.add(DecisionRow(t=end, event=r["event"], request_id=r["id"], fields="{}"))
                if r["idle_at"] is not None:
                    s.add(ActivityRow(request_id=r["id"], t=base + r["idle_at"], busy=False,
                                      utilization=0.0))  # fmt: skip
    finally:
        store.close()
    return len(rows)


def write_past_jobs(db_url: str, held: float, n: int = 6, now: float | None = None) -> None:
    """`n` jobs of one GPU, each held `held` seconds, ended in the hour before `now` (the
    history a wait estimate goes by: admission/estimate.py `History` keeps a day of it),
    into a new store, as a gateway writes their rows (tenant vision, flavor a100)."""
    end = float(int(now if now is not None else time.time()))
    store = Store.open(db_url)
    try:
        with Session(store.engine) as s, s.begin():
            for i in range(n):
                rid, ended = f"r-past-{i:04d}", end - 3600.0 + 600.0 * i / n
                admit = ended - held
                s.add(RequestRow(id=rid, tenant="vision", user="alice", kind="job", gpus=1,
                                 flavor="a100", state="finished", submit_time=admit,
                                 queue_time=admit, assigned_flavor="a100", first_admit=admit,
                                 admit_time=admit, created=admit, updated=ended))  # fmt: skip
                fields = {"tenant": "vision", "flavor": "a100", "gpus": 1}
                s.add(DecisionRow(t=admit, event="admit", request_id=rid,
                                  fields=json.dumps(fields)))  # fmt: skip
                s.add(DecisionRow(t=ended, event="finish", request_id=rid, fields="{}"))
    finally:
        store.close()
