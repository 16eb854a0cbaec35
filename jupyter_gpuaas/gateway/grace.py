"""Preemption with grace, in the request objects the API shows.

A warned victim's object carries when it will be stopped and for whom (`preempt_at`,
`preempted_by`, and `preempt_reason`, a sentence such as "nlp is reclaiming its GPU" that
holders put after "your server will be stopped in 5 min: "). A preemptor waiting out its
victims' grace gets its wait in words: "reclaiming 1 GPU borrowed by vision, in 4 min".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jupyter_gpuaas.admission.model import Config, Request
from jupyter_gpuaas.words import format_duration, gpus_taken, plural


def grace_of(config: Config, tenant: str) -> float:
    """The grace a victim of `tenant` gets: its own `preemption_grace`, else the policy's."""
    spec = config.tenants.get(tenant)
    own = spec.preemption_grace if spec is not None else None
    return float(config.policy.preemption_grace if own is None else own)


def _gpus(n: int) -> str:
    return plural(n, "GPU")


def in_words(seconds: float) -> str:
    """`in 4 min`, `in 30 s`, `in 2 h`; `in a moment` once the deadline is here."""
    return "in a moment" if seconds < 1 else f"in {format_duration(seconds)}"


def preempt_reason(
    victim_tenant: str, victim_gpus: int, by_tenant: str | None, needed: int | None = None
) -> str:
    """Why a warned victim will be stopped, as the end of a sentence for its user, counted
    as its ending will be (words.gpus_taken; `needed`: the preemptor's size)."""
    if by_tenant is None:
        return f"another request needs {gpus_taken(victim_gpus, needed, 'the')}"
    if by_tenant != victim_tenant:
        return f"{by_tenant} is reclaiming {gpus_taken(victim_gpus, needed)}"
    return (
        f"a higher-priority request of {by_tenant} needs {gpus_taken(victim_gpus, needed, 'the')}"
    )


def preemption_fields(
    preempt_at: float | None, preempted_by: str | None, reason: str
) -> dict[str, Any]:
    """The fields a victim's request object carries (all None when not warned)."""
    if preempt_at is None:
        return {"preempt_at": None, "preempted_by": None, "preempt_reason": None}
    return {"preempt_at": preempt_at, "preempted_by": preempted_by, "preempt_reason": reason}


def reclaim_wait(req: Request, victims: Sequence[Request], now: float) -> dict[str, Any] | None:
    """The estimated wait of a preemptor whose victims are in their grace, or None.

    Seconds until the last of them is evicted (earlier if they end by themselves), and
    the basis in words: "reclaiming 1 GPU borrowed by vision, in 4 min".
    """
    warned = [v for v in victims if v.preempt_at is not None]
    if not warned:
        return None
    by_tenant: dict[str, int] = {}
    for v in warned:
        by_tenant[v.tenant] = by_tenant.get(v.tenant, 0) + v.gpus
    parts = []
    for tenant, gpus in by_tenant.items():
        if tenant == req.tenant:
            parts.append(f"taking {_gpus(gpus)} from lower-priority work of {tenant}")
        else:
            parts.append(f"reclaiming {_gpus(gpus)} borrowed by {tenant}")
    seconds = max(0.0, max(float(v.preempt_at or 0.0) for v in warned) - now)
    return {"seconds": round(seconds, 1), "basis": f"{' and '.join(parts)}, {in_words(seconds)}"}
