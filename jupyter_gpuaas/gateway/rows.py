"""The store's tables and rows: what one transaction writes, and what the columns hold.

The ORM classes (the schema that migrations/ creates), the copy between the core's
`Request` and a row, the `Batch` of one decision step, its plain-data `Snapshot`, and
`check_snapshot`: every integer fits a 32-bit column, every string is encodable UTF-8
without NUL and fits its column, so a checked batch can always be written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jupyter_gpuaas.admission.model import Decision, Request, State

from .validate import INT32_MAX, InputError


class RowError(InputError):
    """A value the store's columns cannot hold (HTTP 400 naming the field)."""


class Base(DeclarativeBase):
    pass


class RequestRow(Base):
    """One request, live or ended: every field of the core's `Request` plus what the API adds."""

    __tablename__ = "requests"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(255), index=True)
    user: Mapped[str] = mapped_column(String(255))  # indexed with created, below
    kind: Mapped[str] = mapped_column(String(16))
    gpus: Mapped[int] = mapped_column(Integer)
    flavor: Mapped[str | None] = mapped_column(String(255), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    busy: Mapped[bool] = mapped_column(Boolean, default=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    submit_time: Mapped[float] = mapped_column(Float)
    queue_time: Mapped[float] = mapped_column(Float, default=0.0)
    seq: Mapped[int] = mapped_column(Integer, default=0)
    assigned_flavor: Mapped[str | None] = mapped_column(String(255), nullable=True)
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    devices: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of indices
    first_admit: Mapped[float | None] = mapped_column(Float, nullable=True)
    admit_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    park_expires: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_expires: Mapped[float | None] = mapped_column(Float, nullable=True)
    wants_devices: Mapped[bool] = mapped_column(Boolean, default=False)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    culls: Mapped[int] = mapped_column(Integer, default=0)
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The highest utilization its heartbeats reported (migration 0005): `advise` evidence.
    peak_utilization: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A warned preemption victim: evicted at preempt_at for preempted_by (migration 0003).
    preempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    preempted_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # When its current hold of quota began (migration 0006; admission/model.py).
    held_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)
    # The submission's Idempotency-Key header, unique per user (migration 0004).
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)

    # A user's own list (newest first) and its next pages: migration 0002.
    __table_args__ = (
        Index("ix_requests_user_created", "user", "created"),
        Index("ux_requests_user_idempotency_key", "user", "idempotency_key", unique=True),
    )

    def device_list(self) -> list[int]:
        return list(json.loads(self.devices or "[]"))


class DecisionRow(Base):
    """The append-only decision log: what the core decided, in order."""

    __tablename__ = "decisions"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    t: Mapped[float] = mapped_column(Float, index=True)
    event: Mapped[str] = mapped_column(String(32))
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    fields: Mapped[str] = mapped_column(Text, default="{}")


class ActivityRow(Base):
    """A holder's busy/idle transition, as its heartbeats reported it (migration 0005).

    Only changes are kept (busy -> idle, idle -> busy), not every heartbeat: what
    `history export` needs to give each request its `busy` intervals.
    """

    __tablename__ = "activity"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), index=True)
    t: Mapped[float] = mapped_column(Float)
    busy: Mapped[bool] = mapped_column(Boolean)
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)


class NodeRow(Base):
    """A node the simulated scaler added (inventory nodes are re-read on start)."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[int] = mapped_column(Integer)
    autoscaled: Mapped[bool] = mapped_column(Boolean, default=True)
    created: Mapped[float] = mapped_column(Float)


class LeaderLeaseRow(Base):
    """The leader election's lease (leader.py; one row, id 1): who leads, the epoch every
    write of the leader checks in its transaction, and the database time it last renewed."""

    __tablename__ = "leader_lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    epoch: Mapped[int] = mapped_column(BigInteger)
    renewed: Mapped[float] = mapped_column(Float)


class TenantOverrideRow(Base):
    """An admin's `PUT api/tenants/{name}`: the tenant's spec, replacing the quota file's."""

    __tablename__ = "tenant_overrides"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    spec: Mapped[str] = mapped_column(Text)
    updated: Mapped[float] = mapped_column(Float)


REQUESTS = cast(Table, RequestRow.__table__)
DECISIONS = cast(Table, DecisionRow.__table__)
NODES = cast(Table, NodeRow.__table__)
ACTIVITY = cast(Table, ActivityRow.__table__)
OVERRIDES = cast(Table, TenantOverrideRow.__table__)

# Fields copied verbatim between the core's Request and a row.
_COPIED = (
    "tenant",
    "user",
    "kind",
    "gpus",
    "flavor",
    "priority",
    "busy",
    "submit_time",
    "queue_time",
    "seq",
    "assigned_flavor",
    "node",
    "first_admit",
    "admit_time",
    "idle_since",
    "park_expires",
    "lease_expires",
    "wants_devices",
    "preemptions",
    "culls",
    "reason",
    "preempt_at",
    "preempted_by",
    "held_since",
)


def row_to_request(row: RequestRow) -> Request:
    req = Request(
        id=row.id,
        tenant=row.tenant,
        user=row.user,
        kind=row.kind,
        gpus=row.gpus,
        submit_time=row.submit_time,
        flavor=row.flavor,
        priority=row.priority,
        busy=row.busy,
    )
    for name in _COPIED:
        setattr(req, name, getattr(row, name))
    req.state = State(row.state)
    req.devices = tuple(row.device_list())
    return req


@dataclass
class Batch:
    """What one transaction writes: request rows (new or changed) and decisions."""

    requests: list[tuple[Request, dict[str, Any]]]  # (request, extra columns: name, ...)
    decisions: Sequence[Decision]
    nodes_added: list[tuple[str, str, int]] = field(default_factory=list)  # name, flavor, gpus
    nodes_removed: list[str] = field(default_factory=list)
    tenants: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # overrides put
    # (request id, busy, utilization): holders that turned busy or idle at this instant.
    activity: list[tuple[str, bool, float | None]] = field(default_factory=list)


@dataclass
class Snapshot:
    """A Batch as plain data, taken when the core decided it.

    The arbiter keeps deciding while a group of snapshots is written by the store's
    thread, and the core mutates its Request objects: the rows are copied first.
    """

    rows: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    nodes_added: list[tuple[str, str, int]]
    nodes_removed: list[str]
    tenants: list[tuple[str, str]]  # (name, spec JSON)
    now: float
    activity: list[dict[str, Any]] = field(default_factory=list)


def snapshot(batch: Batch, now: float) -> Snapshot:
    """Copy a batch into plain data (raises TypeError if a decision is not JSON)."""
    rows = []
    for req, extra in batch.requests:
        row = {name: getattr(req, name) for name in _COPIED}
        row["id"] = req.id
        row["state"] = req.state.value
        row["devices"] = json.dumps(list(req.devices))
        row["updated"] = now
        row.update(extra)
        row.setdefault("created", now)
        rows.append(row)
    decisions = []
    for d in batch.decisions:
        fields = {k: v for k, v in d.to_json().items() if k not in ("t", "event", "id")}
        decisions.append(
            {
                "t": d.t,
                "event": d.event,
                "request_id": d.id,
                "fields": json.dumps(fields, default=list),
            }
        )
    return Snapshot(
        rows,
        decisions,
        list(batch.nodes_added),
        list(batch.nodes_removed),
        [(name, json.dumps(spec)) for name, spec in batch.tenants],
        now,
        [
            {"request_id": rid, "t": now, "busy": busy, "utilization": util}
            for rid, busy, util in batch.activity
        ],
    )


def _check_column(table: Table, name: str, value: Any, where: str) -> None:
    column = table.c.get(name)
    if column is None or value is None:
        return
    kind = column.type
    if isinstance(kind, Boolean):
        return
    if isinstance(kind, Integer):
        if isinstance(value, int) and not -INT32_MAX - 1 <= value <= INT32_MAX:
            raise RowError(f"{where} must be an integer from {-INT32_MAX} to {INT32_MAX}", where)
    elif isinstance(kind, Float):
        if isinstance(value, float) and not math.isfinite(value):
            raise RowError(f"{where} must be a finite number", where)
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            problem = "is not valid UTF-8 (it holds a lone surrogate)"
            raise RowError(f"{where} {problem}", where) from None
        if "\x00" in value:
            raise RowError(f"{where} must not contain a NUL character", where)
        length = getattr(kind, "length", None)
        if length is not None and len(value) > length:
            raise RowError(f"{where} must be at most {length} characters", where)


def check_snapshot(snap: Snapshot) -> None:
    """Raise RowError if a value of this batch cannot be stored (see the module docstring)."""
    for row in snap.rows:
        for name, value in row.items():
            _check_column(REQUESTS, name, value, name)
    for d in snap.decisions:
        for name, value in d.items():
            _check_column(DECISIONS, name, value, name)
    for name, spec in snap.tenants:
        _check_column(OVERRIDES, "name", name, "name")
        _check_column(OVERRIDES, "spec", spec, "spec")
    for name, flavor, gpus in snap.nodes_added:
        for col, value in (("name", name), ("flavor", flavor), ("gpus", gpus)):
            _check_column(NODES, col, value, col)
    for a in snap.activity:
        for name, value in a.items():
            _check_column(ACTIVITY, name, value, name)
