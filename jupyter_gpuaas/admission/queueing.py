"""The queues: every tenant's queue (queues.py's `TenantQueue`), which tenants changed
since they were last nominated, which StrictFIFO queues wait behind their first request,
and the positions index once a driver asked for a position (Kueue's queue manager).

Every entry into a tenant's queue and every exit goes through `enqueue` and `dequeue`,
which keep the positions index (positions.py) in step. A collaborator of
:class:`~jupyter_gpuaas.admission.core.AdmissionCore`.
"""

from __future__ import annotations

from collections.abc import Iterable

from .model import Decision, Request, State
from .positions import Positions
from .queues import Bucket, TenantQueue
from .views import Position


class Queues:
    def __init__(self, tenants: Iterable[str]) -> None:
        self.tenants: dict[str, TenantQueue] = {t: TenantQueue() for t in tenants}
        # The tenants whose queue or room changed since they were last nominated: the
        # heads of the next cycle (step 1).
        self.dirty: set[str] = set()
        # StrictFIFO tenants whose first request can neither fit nor preempt.
        self.strict_blocked: set[str] = set()
        self.positions: Positions | None = None  # built at the first position asked for

    def add_tenants(self, tenants: Iterable[str]) -> None:
        for t in tenants:
            self.tenants.setdefault(t, TenantQueue())

    def enqueue(self, req: Request) -> Bucket:
        """Into its tenant's queue (submitted, restored or requeued), QUEUED already."""
        q = self.tenants[req.tenant]
        bucket = q.push(req)
        # A new head may go where the old one could not (a higher priority may preempt):
        # its bucket, or a StrictFIFO tenant, looks again. A requeued request (a preempted
        # job, a culled one busy again) can be such a head as much as a new one.
        if bucket.inadmissible and q.head(bucket) is req:
            bucket.inadmissible = False
        if req.tenant in self.strict_blocked and q.first() is req:
            self.strict_blocked.discard(req.tenant)
        if self.positions is not None:
            self.positions.add(req)
        self.dirty.add(req.tenant)
        return bucket

    def dequeue(self, req: Request) -> None:
        """Out of its tenant's queue (admitted, or ended while queued)."""
        q = self.tenants[req.tenant]
        if req.tenant in self.strict_blocked and q.first() is req:
            # The head that blocked a StrictFIFO queue leaves (cancelled, say): the next
            # one may fit.
            self.strict_blocked.discard(req.tenant)
            self.dirty.add(req.tenant)
        q.remove(req.id)
        if self.positions is not None:
            self.positions.discard(req.id)

    def requeue(self, req: Request, now: float, queue_time: float, out: list[Decision]) -> None:
        """Queued again: a preempted job (by its submit time), a culled request busy again
        or one whose reservation expired while it wanted devices (by now)."""
        req.state = State.QUEUED
        req.queue_time = queue_time
        req.assigned_flavor = None
        req.wants_devices = False
        self.enqueue(req)
        out.append(Decision(now, "requeue", req.id))

    def touch(self, tenant: str) -> None:
        """The tenant's queue or room changed: it is nominated again next cycle."""
        self.dirty.add(tenant)

    def wake(self, tenants: Iterable[str]) -> None:
        """Clear every mark of these tenants' queues: all their heads look again."""
        for t in tenants:
            self.tenants[t].clear_marks()
            self.strict_blocked.discard(t)
            self.dirty.add(t)

    def changed(self) -> list[str]:
        """Step 1 of the cycle: the tenants changed since the last look, now looked at."""
        changed = list(self.dirty)
        self.dirty.clear()
        return changed

    def position(self, rid: str) -> Position | None:
        """1-based place of a queued request in its tenant's queue and among all queued
        (by bisection: positions.py; `views.position` is the same answer by a scan)."""
        if self.positions is None:  # the first question: from now on kept in step
            queued = (r for q in self.tenants.values() for r in q.requests())
            self.positions = Positions(queued)
        return self.positions.position(rid)
