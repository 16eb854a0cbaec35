"""Why a queued request waits: the typed reason nomination leaves behind (Kueue's
"inadmissible because ..." on a workload), as plain data.

Nomination records, for each bucket head it could not admit, whether quota or devices
stopped it (in `_capacity_blocked`: quota would admit it but no node has room; absent,
quota stopped it). The flavor it waits in is asked again when read
(autoscale.capacity_flavor): quota may have moved since. `waiting_reason` turns that
record and the core's counts into a :class:`Reason`; the sentence a person reads is
built from it outside the core (words.reason_sentence), so the core stays free of
wording and of the package around it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .autoscale import capacity_flavor
from .ledger import Ledger
from .model import Request
from .nodes import Cluster
from .queues import BucketKey, TenantQueue

QUOTA: Final = "quota"
CAPACITY: Final = "capacity"
FIFO: Final = "fifo"


@dataclass(frozen=True)
class Reason:
    """Why the head a request waits on is inadmissible.

    `quota`: `tenant` holds `used` of its `nominal` GPUs of `flavor` and its tree could
    lend it `lendable` more (`lent_out`: how much of its own unused quota others of the
    tree hold), fewer than the head's `gpus`. `capacity`: quota would admit
    it but the widest gap on a `flavor` node is `free` GPUs; `coming` nodes are being
    added. `fifo`: behind `head`, the first request of a StrictFIFO tenant. `head` is
    also set when the request waits behind another head of its own bucket.
    """

    kind: str
    tenant: str
    flavor: str
    gpus: int
    used: int = 0
    nominal: int = 0
    lendable: int = 0
    lent_out: int = 0
    cohort: str = ""
    free: int = 0
    coming: int = 0
    head: str = ""

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tenant": self.tenant, "flavor": self.flavor, "gpus": self.gpus}
        if self.kind == QUOTA:
            out.update(used=self.used, nominal=self.nominal, lendable=self.lendable)
            out["lent_out"] = self.lent_out
            out["cohort"] = self.cohort or None
        elif self.kind == CAPACITY:
            out.update(free=self.free, coming=self.coming)
        if self.head:
            out["head"] = self.head
        return out


def waiting_reason(
    req: Request,
    queue: TenantQueue,
    strict: bool,
    strict_blocked: bool,
    flavors: Sequence[str],
    capacity_blocked: Mapping[tuple[str, BucketKey], str],
    ledger: Ledger,
    cluster: Cluster,
    provisioning: Mapping[str, Mapping[str, float]],
) -> Reason | None:
    """The reason of a queued `req`: its own if it heads its bucket (or its StrictFIFO
    queue), else `fifo` behind a StrictFIFO head or the reason of its bucket's head.
    None while nomination has not failed its head (not looked at since it came)."""
    tenant = req.tenant
    bkey: BucketKey = (req.flavor, req.gpus)
    head = req
    if strict:
        first = queue.first()
        if first is not None and first is not req:
            return Reason(FIFO, tenant, first.flavor or "", first.gpus, head=first.id)
        if not strict_blocked:
            return None
    else:
        bucket = queue.buckets.get(bkey)
        if bucket is None or not bucket.inadmissible:
            return None
        top = queue.head(bucket)
        if top is not None:
            head = top
    flavor = None
    if (tenant, bkey) in capacity_blocked:  # (as it stands now: quota may have moved)
        flavor = capacity_flavor(tenant, bkey, flavors, ledger, cluster)
    behind = "" if head is req else head.id
    if flavor is not None:
        coming = len(provisioning.get(flavor, {}))
        free = cluster.widest_gap(flavor)
        return Reason(CAPACITY, tenant, flavor, head.gpus, free=free, coming=coming, head=behind)
    candidates = (head.flavor,) if head.flavor else tuple(flavors)
    # The flavor it is closest to getting: the most quota room, then the quota order.
    best = max(candidates, key=lambda f: ledger.room(tenant, f), default="")
    used = ledger.usage.get((tenant, best), 0) if best else 0
    nominal = ledger.nominal(tenant, best) if best else 0
    own = max(0, nominal - used)
    room = ledger.room(tenant, best) if best else 0
    lendable = max(0, room - own)
    lent_out = max(0, own - room)  # its unused quota, borrowed by others of its tree
    path = ledger.path(tenant)
    cohort = path[0] if path else ""
    return Reason(
        QUOTA, tenant, best, head.gpus, used, nominal, lendable, lent_out, cohort, head=behind
    )
