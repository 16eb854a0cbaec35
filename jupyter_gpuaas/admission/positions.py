"""What the core keeps for its drivers' views: queue positions, the running grants, and
who has a parked reservation.

Positions. The gateway shows a queued request's place (in its tenant's queue and
overall) in every answer and every SSE event about it, so it must not cost a scan of
every queue. The queued requests' order keys are kept in sorted lists and a position is
a bisection. The simulator never asks: the lists are built at the first question and
kept in step from then on, so a replay pays nothing for them. Same definition as
`views.position` (the scan, kept as the reference): the tenant position counts the
tenant's requests with a smaller order key; the overall one, all queued requests with a
smaller (priority, queue time).

Parked reservations, by (user, tenant): a submission that may take one over looks at
that user's few, not at every live request.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import Any

from .model import Request
from .queues import OrderKey, order_key
from .views import Position


class Positions:
    """Sorted order keys of the queued requests (built from them, then kept in step)."""

    def __init__(self, queued: Iterable[Request]) -> None:
        self._queued: dict[str, tuple[str, OrderKey]] = {}  # rid -> (tenant, key)
        self._overall: list[tuple[int, float]] = []  # sorted (-priority, queue time)
        self._tenant: dict[str, list[OrderKey]] = {}  # tenant -> sorted keys
        for req in queued:
            key = order_key(req)
            self._queued[req.id] = (req.tenant, key)
            self._overall.append((key[0], key[1]))
            self._tenant.setdefault(req.tenant, []).append(key)
        self._overall.sort()
        for keys in self._tenant.values():
            keys.sort()

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, req: Request) -> None:
        """`req` was queued (submitted, requeued or restored), with its order key now."""
        self.discard(req.id)
        key = order_key(req)
        self._queued[req.id] = (req.tenant, key)
        insort(self._overall, (key[0], key[1]))
        insort(self._tenant.setdefault(req.tenant, []), key)

    def discard(self, rid: str) -> None:
        entry = self._queued.pop(rid, None)
        if entry is None:
            return
        tenant, key = entry
        _delete(self._overall, (key[0], key[1]))
        keys = self._tenant[tenant]
        _delete(keys, key)
        if not keys:
            del self._tenant[tenant]

    def position(self, rid: str) -> Position | None:
        entry = self._queued.get(rid)
        if entry is None:
            return None
        tenant, key = entry
        keys = self._tenant[tenant]
        return Position(
            bisect_left(keys, key) + 1,
            len(keys),
            bisect_left(self._overall, (key[0], key[1])) + 1,
            len(self._overall),
        )


def _delete(items: list[Any], key: tuple[Any, ...]) -> None:
    i = bisect_left(items, key)
    if i < len(items) and items[i] == key:
        del items[i]


class Parked:
    """Parked reservations by (user, tenant), for a submission that may take one over."""

    def __init__(self) -> None:
        self._by_user: dict[tuple[str, str], dict[str, Request]] = {}

    def add(self, req: Request) -> None:
        self._by_user.setdefault((req.user, req.tenant), {})[req.id] = req

    def discard(self, req: Request) -> None:
        mine = self._by_user.get((req.user, req.tenant))
        if mine is not None and mine.pop(req.id, None) is not None and not mine:
            del self._by_user[(req.user, req.tenant)]

    def has(self, user: str) -> bool:
        return any(u == user for u, _ in self._by_user)

    def claimable(self, req: Request) -> Request | None:
        """The reservation `req` would take over: same user, tenant, kind and size, and
        the flavor it asks for (the earliest submitted of several)."""
        mine = self._by_user.get((req.user, req.tenant))
        best: Request | None = None
        for other in mine.values() if mine else ():
            if (
                other.kind == req.kind
                and other.gpus == req.gpus
                and req.flavor in (None, other.assigned_flavor)
                and (best is None or other.seq < best.seq)
            ):
                best = other
        return best
