"""Where each queued request stands, kept in step with the core's decisions.

The API shows a queued request's position (in its tenant's queue and overall) in every
answer and every SSE event about it. The core's `position()` scans all queues per call
(fine for one call, O(n) per submission under load), so the arbiter keeps this index:
the queued requests' order keys in sorted lists, updated for each request a committed
batch touched (every change of a request's queue state comes with a decision about it),
and answered by bisection. Same definition as the core: the tenant position counts the
tenant's requests with a smaller order key; the overall one, all queued requests with a
smaller (priority, queue time). It also keeps the admitted requests (wait estimates look
at the running grants, not at every live request) and who has a parked reservation (a
submission looks for one to take over only then: the core's look is a scan of all live
requests).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any

from jupyter_gpuaas.admission.core import Position
from jupyter_gpuaas.admission.model import Request, State
from jupyter_gpuaas.admission.queues import OrderKey, order_key


class QueueIndex:
    def __init__(self) -> None:
        self._queued: dict[str, tuple[str, OrderKey]] = {}  # rid -> (tenant, key)
        self._overall: list[tuple[int, float]] = []  # sorted (-priority, queue time)
        self._tenant: dict[str, list[OrderKey]] = {}  # tenant -> sorted keys
        self.admitted: dict[str, Request] = {}
        self._parked: dict[str, str] = {}  # rid -> user
        self._parked_users: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def sync(self, req: Request) -> None:
        """Take in the request's current state (call for every request a batch touched)."""
        old = self._queued.get(req.id)
        new = (req.tenant, order_key(req)) if req.state is State.QUEUED else None
        if old != new:
            if old is not None:
                self._remove(req.id, old)
            if new is not None:
                self._queued[req.id] = new
                insort(self._overall, new[1][:2])
                insort(self._tenant.setdefault(new[0], []), new[1])
        if req.state is State.ADMITTED:
            self.admitted[req.id] = req
        else:
            self.admitted.pop(req.id, None)
        if req.state is State.PARKED:
            if req.id not in self._parked:
                self._parked[req.id] = req.user
                self._parked_users[req.user] = self._parked_users.get(req.user, 0) + 1
        elif req.id in self._parked:
            user = self._parked.pop(req.id)
            self._parked_users[user] -= 1
            if not self._parked_users[user]:
                del self._parked_users[user]

    def has_parked(self, user: str) -> bool:
        """Whether `user` holds a parked reservation (one a new submission may take over)."""
        return user in self._parked_users

    def _remove(self, rid: str, entry: tuple[str, OrderKey]) -> None:
        del self._queued[rid]
        tenant, key = entry
        _delete(self._overall, key[:2])
        keys = self._tenant[tenant]
        _delete(keys, key)
        if not keys:
            del self._tenant[tenant]

    def position(self, req: Request) -> Position | None:
        entry = self._queued.get(req.id)
        if entry is None:
            return None
        tenant, key = entry
        keys = self._tenant[tenant]
        return Position(
            bisect_left(keys, key) + 1,
            len(keys),
            bisect_left(self._overall, key[:2]) + 1,
            len(self._overall),
        )


def _delete(items: list[Any], key: tuple[Any, ...]) -> None:
    i = bisect_left(items, key)
    if i < len(items) and items[i] == key:
        del items[i]
