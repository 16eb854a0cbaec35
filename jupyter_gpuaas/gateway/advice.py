"""`jupyter-gpuaas advise` and `GET api/advice`: right-sizing advice from a gateway's own
history, each piece with its evidence.

Two kinds, both from what the store holds (`history.read_history`, a `StoreHistory`):

- **A smaller GPU** (per user, kind and flavor): the highest utilization each grant's
  heartbeats reported (`peak_utilization`, migration 0005). When at least `min_grants`
  grants are known and 90% of them peaked at or under `low_utilization`, the user's work
  would do on less: "alice's kernels on a100 peaked at 20% utilization or less in 9 of
  her 10 grants ...". Utilization is all the holders report today, not memory, and the
  sentence says so rather than naming a MIG profile it cannot justify.
- **Quota that sits idle while others wait** (per tenant and flavor): the p95 of GPUs the
  tenant held over the period (time-weighted, from a replay of the exported history), set
  against its quota. When the unused part is at least one GPU and a quarter of the quota,
  and another tenant's p95 wait is at least `min_wait`, the what-if "move the unused part
  to the tenant that waits" is replayed through the simulator on the same history, and the
  advice quotes both tenants' p95 waits before and after. Advice whose what-if helps
  nobody is not given.

Nothing is advised on fewer than `min_grants` grants (a tenant needs that many admitted
requests of the flavor), so a quiet week does not produce confident sentences.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from jupyter_gpuaas.words import format_duration

from .history import (
    StoreHistory,
    add_store_arguments,
    parse_span,
    read_history,
    read_quotas,
    scenario_from_history,
)

PROG = "jupyter-gpuaas advise"
_KIND_WORDS = {"kernel": "kernels", "server": "servers", "job": "jobs"}


@dataclass
class Advice:
    """One piece of advice: a sentence, whom it is about, and why it is believed."""

    kind: str  # "smaller_gpu" | "move_quota"
    subject: str  # the user or the tenant it is about
    tenant: str
    flavor: str
    sentence: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def _nearest_rank(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[max(1, math.ceil(p / 100.0 * len(ordered))) - 1]


def smaller_gpu_advice(
    requests: Iterable[Mapping[str, Any]],
    *,
    min_grants: int,
    low_utilization: float,
    period: tuple[float, float],
) -> list[Advice]:
    """Per (user, kind, flavor): advice when 90% of the grants peaked low."""
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    for r in requests:
        peak = r.get("peak_utilization")
        flavor = r.get("assigned_flavor") or r.get("flavor")
        if peak is None or flavor is None or r.get("first_admit") is None:
            continue
        key = (str(r["user"]), str(r["kind"]), str(flavor), str(r["tenant"]))
        groups.setdefault(key, []).append(float(peak))
    out: list[Advice] = []
    for (user, kind, flavor, tenant), peaks in sorted(groups.items()):
        if len(peaks) < min_grants:
            continue
        p90 = _nearest_rank(peaks, 90)
        if p90 > low_utilization:
            continue
        low = sum(1 for p in peaks if p <= low_utilization)
        kinds = _KIND_WORDS.get(kind, kind + "s")
        out.append(
            Advice(
                "smaller_gpu",
                user,
                tenant,
                flavor,
                f"{user}'s {kinds} on {flavor} peaked at {100 * p90:.0f}% GPU utilization or "
                f"less in {low} of {len(peaks)} grants ({_stamp(period[0])} to "
                f"{_stamp(period[1])}): a smaller GPU or a MIG slice would likely do "
                "(by utilization; memory is not reported yet).",
                {
                    "grants": len(peaks),
                    "p90_peak_utilization": round(p90, 3),
                    "grants_at_or_under": low,
                    "threshold": low_utilization,
                    "since": period[0],
                    "until": period[1],
                },
            )
        )
    return out


def _held_p95(events: Iterable[Mapping[str, Any]], end: float) -> dict[tuple[str, str], float]:
    """Time-weighted p95 of GPUs bound per (tenant, flavor), from a decision stream."""
    grant: dict[str, tuple[tuple[str, str], int]] = {}  # id -> ((tenant, flavor), gpus)
    bound: set[str] = set()
    level: dict[tuple[str, str], int] = {}
    spans: dict[tuple[str, str], dict[int, float]] = {}
    last: float | None = None

    def elapse(until: float) -> None:
        if last is not None and until > last:
            for key, n in level.items():
                by_level = spans.setdefault(key, {})
                by_level[n] = by_level.get(n, 0.0) + (until - last)

    for e in events:
        t = float(e["t"])
        elapse(t)
        last = t
        rid, ev = e.get("id"), e["event"]
        if rid is None:
            continue
        if ev == "admit":
            grant[rid] = ((str(e["tenant"]), str(e["flavor"])), int(e["gpus"]))
        if ev in ("admit", "resume") and rid in grant and rid not in bound:
            key, gpus = grant[rid]
            bound.add(rid)
            level[key] = level.get(key, 0) + gpus
        elif ev in ("preempt", "cull", "finish", "cancel") and rid in bound:
            key, gpus = grant[rid]
            bound.discard(rid)
            level[key] -= gpus
    elapse(end)
    out: dict[tuple[str, str], float] = {}
    for key, by_level in spans.items():
        total = sum(by_level.values())
        acc = 0.0
        for n in sorted(by_level):
            acc += by_level[n]
            if total > 0 and acc >= 0.95 * total:
                out[key] = float(n)
                break
    return out


def move_quota_advice(
    scenario: Mapping[str, Any],
    *,
    min_grants: int,
    min_wait: float,
    period: tuple[float, float],
) -> list[Advice]:
    """Per (tenant, flavor) whose quota sits idle while another tenant waits: the what-if
    of moving the idle part to the tenant that waits longest, replayed on the history."""
    from jupyter_gpuaas.sim.compare import compare, simulate
    from jupyter_gpuaas.sim.scenario import parse_scenario

    base = parse_scenario(json.loads(json.dumps(scenario)))
    a = simulate(base, None, keep_events=True)
    per_tenant = a.result["summary"].get("per_tenant", {})
    held = _held_p95(a.events, float(a.result["summary"].get("end", 0.0)))
    admitted: dict[tuple[str, str], int] = {}
    for rid, r in a.result["requests"].items():
        if r.get("admitted_at") is not None and r.get("flavor"):
            spec = next(q for q in base.requests if q.id == rid)
            key = (spec.tenant, str(r["flavor"]))
            admitted[key] = admitted.get(key, 0) + 1
    tenants: Mapping[str, Any] = scenario.get("tenants", {})
    out: list[Advice] = []
    for tenant, spec in tenants.items():
        for flavor, quota in (spec.get("quota") or {}).items():
            quota = int(quota)
            grants = admitted.get((tenant, flavor), 0)
            if quota <= 0 or grants < min_grants:
                continue
            used = math.ceil(held.get((tenant, flavor), 0.0))
            spare = quota - used
            if spare < 1 or spare < quota / 4:
                continue
            waiting = [
                (float(per_tenant.get(w, {}).get("wait_p95", 0.0)), w)
                for w, wspec in tenants.items()
                if w != tenant and flavor in (wspec.get("quota") or {})
            ]
            waiting = [(p95, w) for p95, w in waiting if p95 >= min_wait]
            if not waiting:
                continue
            _, to = max(waiting)
            changed = json.loads(json.dumps(scenario))
            changed["tenants"][tenant]["quota"][flavor] = quota - spare
            to_quota = int(changed["tenants"][to]["quota"][flavor])
            changed["tenants"][to]["quota"][flavor] = to_quota + spare
            b = simulate(parse_scenario(changed), None, keep_events=False)
            table = compare(a, b)["per_tenant"]
            gain, cost = table[to]["wait_p95"], table[tenant]["wait_p95"]
            if gain["diff"] >= 0:
                continue  # the what-if helps nobody: no advice
            out.append(
                Advice(
                    "move_quota",
                    tenant,
                    tenant,
                    flavor,
                    f"{tenant}'s {flavor} quota of {quota} peaked at {used} in use (p95, "
                    f"{_stamp(period[0])} to {_stamp(period[1])}): moving {spare} of it to "
                    f"{to} would cut {to}'s p95 wait from {format_duration(gain['a'])} to "
                    f"{format_duration(gain['b'])}, and {tenant}'s would go from "
                    f"{format_duration(cost['a'])} to {format_duration(cost['b'])} "
                    f"(a replay of {len(base.requests)} requests).",
                    {
                        "grants": grants,
                        "quota": quota,
                        "p95_in_use": used,
                        "move": spare,
                        "to": to,
                        "what_if": {
                            "set": [
                                f"tenants.{tenant}.quota.{flavor}={quota - spare}",
                                f"tenants.{to}.quota.{flavor}={to_quota + spare}",
                            ]
                        },
                        "wait_p95": {to: gain, tenant: cost},
                        "requests_replayed": len(base.requests),
                        "since": period[0],
                        "until": period[1],
                    },
                )
            )
    return out


def advise(
    quotas: Mapping[str, Any],
    history: StoreHistory,
    *,
    now: float,
    since: float,
    min_grants: int = 10,
    low_utilization: float = 0.3,
    min_wait: float = 300.0,
) -> list[Advice]:
    """Every piece of advice a period's history supports (see the module docstring)."""
    period = (since, now)
    out = smaller_gpu_advice(
        history.requests, min_grants=min_grants, low_utilization=low_utilization, period=period
    )
    if history.requests:
        scenario = scenario_from_history(quotas, history, now=now)
        out += move_quota_advice(scenario, min_grants=min_grants, min_wait=min_wait, period=period)
    return out


def advise_from_store(
    db_url: str,
    quotas: Mapping[str, Any],
    span: float,
    *,
    min_grants: int = 10,
    low_utilization: float = 0.3,
) -> dict[str, Any]:
    """The advice over the store's last `span` seconds, as `advise --json` and `GET
    api/advice` answer it (SQLAlchemyError when the store cannot be read)."""
    now = time.time()
    history = read_history(db_url, now - span, None)
    advice = advise(
        quotas,
        history,
        now=now,
        since=now - span,
        min_grants=min_grants,
        low_utilization=low_utilization,
    )
    return {
        "advice": [a.to_json() for a in advice],
        "since": now - span,
        "until": now,
        "requests": len(history.requests),
        "min_grants": min_grants,
    }


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "advise",
        help="right-sizing and quota advice from a gateway's history, with evidence",
        description="Read a gateway's store and advise: users whose grants peak low "
        "(a smaller GPU would do), and quota that sits idle while another tenant waits "
        "(with the what-if replayed through the simulator).",
    )
    add_store_arguments(parser)
    # Read as text and checked in run(), so that a bad value is one sentence naming the
    # flag, like every other of this command's errors (argparse's own adds its usage).
    parser.add_argument(
        "--min-grants",
        default="10",
        metavar="N",
        help="give no advice on fewer grants than this (default 10)",
    )
    parser.add_argument(
        "--low-utilization",
        default="0.3",
        metavar="X",
        help="peak utilization (0..1) at or under which a grant counts as low (0.3)",
    )
    parser.add_argument("--json", action="store_true", help="print the advice as JSON")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    def error(message: str) -> int:
        print(f"{PROG}: {message}", file=sys.stderr)
        return 2

    try:
        span = parse_span(args.since)
    except ValueError as e:
        return error(f"--since: {e}")
    if span <= 0:
        return error(f"--since must be a length of time longer than 0, not {args.since!r}")
    try:
        min_grants = int(args.min_grants)
    except ValueError:
        min_grants = 0
    if min_grants < 1:
        return error(f"--min-grants must be a whole number of at least 1, not {args.min_grants!r}")
    try:
        low_utilization = float(args.low_utilization)
    except ValueError:
        low_utilization = math.nan
    if not 0 <= low_utilization <= 1:  # NaN too
        return error(
            f"--low-utilization must be a number from 0 to 1, not {args.low_utilization!r}"
        )
    try:
        quotas = read_quotas(args.quotas)
    except ValueError as e:
        return error(f"--quotas: {e}")
    try:
        out = advise_from_store(
            args.db_url,
            quotas,
            span,
            min_grants=min_grants,
            low_utilization=low_utilization,
        )
    except SQLAlchemyError as e:
        return error(f"--db-url: cannot read the store: {str(e).splitlines()[0]}")
    if args.json:
        sys.stdout.write(json.dumps({"advice": out["advice"]}) + "\n")
    elif not out["advice"]:
        print(
            f"No advice: {out['requests']} requests in the last {args.since}, and nothing "
            f"stands out on at least {min_grants} grants."
        )
    else:
        for a in out["advice"]:
            print(f"- {a['sentence']}")
    return 0
