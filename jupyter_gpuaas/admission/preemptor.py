"""Issuing preemptions (Kueue's `Preemptor.IssuePreemptions`): the victims nomination
chose for a head (preemption.py's `find_victims`) are evicted at once (jobs, and victims
without `preemption_grace`) or warned: a warned victim goes when its grace ends (the
EVICT timer), and its preemptor waits for it and keeps its room meanwhile (grace.py).

A collaborator of :class:`~jupyter_gpuaas.admission.core.AdmissionCore`; the eviction
itself is a release (releases.py `evict`).
"""

from __future__ import annotations

from typing import Any

from .grace import EVICT, Graces
from .model import Decision, Request
from .policies import Policies
from .releases import Releases
from .timers import Timers


class Preemptor:
    def __init__(
        self, policies: Policies, timers: Timers, graces: Graces, releases: Releases
    ) -> None:
        self._policies = policies
        self._timers = timers
        self._graces = graces
        self._releases = releases

    def issue(
        self,
        by: Request,
        flavor: str,
        key: tuple[Any, ...],
        victims: list[Request],
        now: float,
        out: list[Decision],
    ) -> bool:
        """Preempt jobs (and victims without grace) at once, warn the others: True when
        none was warned, so the preemptor can be admitted now."""
        warned = False
        for v in victims:
            grace = 0.0 if v.kind == "job" else self._policies.setting(v.tenant, "preemption_grace")
            if grace <= 0:
                self._releases.evict(v, by, now, out)
                continue
            warned = True
            v.preempt_at, v.preempted_by = now + grace, by.id
            self._graces.warn(by.id, flavor, key, v)
            self._timers.set(EVICT, v.id, v.preempt_at)
            out.append(Decision(now, "preempt_warning", v.id, {"by": by.id, "at": v.preempt_at}))
        return not warned

    def restore_warning(self, req: Request) -> None:
        """A victim read back from the store was warned: its grace runs on."""
        if req.preempt_at is not None and req.preempted_by is not None:
            self._graces.warn(req.preempted_by, req.assigned_flavor or "", None, req)
            self._timers.set(EVICT, req.id, req.preempt_at)
