"""`jupyter-gpuaas history export`: what a gateway saw, as a scenario the simulator replays.

An admin asks "what if vision had 8 more GPUs, or we culled after 20 minutes?" about their
own users, not about a trace someone wrote. The store already holds the answer's input:
every request with its submit, admission and end, the decision log, and (migration 0005)
each holder's busy/idle transitions. `scenario_from_history` turns them into the scenario
format of docs/SCENARIO.md, with the quotas in force (the quota file the gateway reads,
plus the admins' overrides kept in the store), so that

    jupyter-gpuaas history export --db-url URL --quotas quotas.yaml > mine.yaml
    jupyter-gpuaas simulate mine.yaml --set tenants.vision.quota.a100=8

replays the same demand under another policy.

What a request becomes:
- `submit`: seconds after the first submit of the window;
- `duration`: how long it held GPUs once admitted, until the holder's own end (finish or
  the user's cancel; for a culled or expired holder, the last thing heard of it). A job
  that was preempted and requeued counts its last, complete run. A request that never
  got GPUs gets the median duration of its kind in the window (else one hour): under
  another policy it might be admitted, and it would then hold GPUs for some time;
- `busy`: the intervals, from its first admission, in which its heartbeats said busy
  (from the busy/idle transitions); absent when it never reported idle, as the format's
  default (busy for its whole duration) says;
- `cancel`: when its user cancelled it while it still waited;
- a request still live at the end of the window holds GPUs until then (`until` closes
  the scenario there), which is what was known.

Pure except `read_history`, `read_quotas` and `run`: the builder takes rows as plain dicts.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROG = "jupyter-gpuaas history"

#: Decisions that end a holder's time on GPUs for good (its own end, or the gateway's).
_ENDS = ("finish", "cancel", "expire", "reject")
_DEFAULT_DURATION = 3600.0
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_span(text: str) -> float:
    """`30d`, `12h`, `90m`, `3600` (seconds) -> seconds; ValueError with a sentence."""
    m = _SPAN.match(text)
    if m is None:
        raise ValueError(f"not a length of time: {text!r} (try 30d, 12h, 90m or seconds)")
    return float(m.group(1)) * _UNIT[m.group(2)]


def _round(x: float) -> float | int:
    r = round(x, 3)
    return int(r) if r == int(r) else r


def _busy_intervals(
    admitted: float, end: float, transitions: Sequence[Mapping[str, Any]]
) -> list[list[float | int]] | None:
    """Busy intervals from the first admission, or None when it never reported idle."""
    if not any(not t["busy"] for t in transitions):
        return None
    out: list[list[float | int]] = []
    busy_from: float | None = admitted  # a holder starts busy (the core's default)
    for t in sorted(transitions, key=lambda a: (a["t"], a.get("seq", 0))):
        at = min(max(float(t["t"]), admitted), end)
        if t["busy"] and busy_from is None:
            busy_from = at
        elif not t["busy"] and busy_from is not None:
            if at > busy_from:
                out.append([_round(busy_from - admitted), _round(at - admitted)])
            busy_from = None
    if busy_from is not None and end > busy_from:
        out.append([_round(busy_from - admitted), _round(end - admitted)])
    return out


@dataclass
class StoreHistory:
    """What the store holds of a period, as plain rows (`read_history`).

    `requests`: rows of the requests table (id, tenant, user, kind, gpus, flavor, priority,
    state, submit_time, first_admit, admit_time, peak_utilization, ...); `decisions`: rows
    of the log (t, event, request_id); `activity`: busy/idle transitions (request_id, t,
    busy); `overrides`: the admins' tenant specs, by tenant.
    """

    requests: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    activity: list[dict[str, Any]] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)


def scenario_from_history(
    quotas: Mapping[str, Any], history: StoreHistory, *, now: float
) -> dict[str, Any]:
    """The scenario (a dict in docs/SCENARIO.md's format) of a period's store rows, with
    the quota file's tenants under the admins' overrides; `now` closes what is still live.
    """
    rows = sorted(history.requests, key=lambda r: (float(r["submit_time"]), str(r["id"])))
    by_request: dict[str, list[dict[str, Any]]] = {}
    for d in history.decisions:
        if d.get("request_id") is not None:
            by_request.setdefault(str(d["request_id"]), []).append(d)
    moves: dict[str, list[dict[str, Any]]] = {}
    for a in history.activity:
        moves.setdefault(str(a["request_id"]), []).append(a)
    t0 = float(rows[0]["submit_time"]) if rows else now
    end_of_window = max(now, t0)

    held: dict[str, list[float]] = {}  # kind -> durations of requests that got GPUs
    built: list[tuple[dict[str, Any], dict[str, Any], float | None]] = []
    for row in rows:
        rid = str(row["id"])
        log = sorted(by_request.get(rid, ()), key=lambda d: (float(d["t"]), d.get("seq", 0)))
        admits = [float(d["t"]) for d in log if d["event"] == "admit"]
        first = row.get("first_admit")
        first_admit = float(first) if first is not None else (admits[0] if admits else None)
        end: float | None = None
        ended_by: str | None = None
        for d in log:
            if d["event"] in _ENDS:
                end, ended_by = float(d["t"]), str(d["event"])
        if end is None and log and first_admit is not None and row["state"] in ("culled",):
            end = float(log[-1]["t"])
        req: dict[str, Any] = {
            "id": rid,
            "tenant": row["tenant"],
            "user": row["user"],
            "kind": row["kind"],
            "gpus": int(row["gpus"]),
            "submit": _round(float(row["submit_time"]) - t0),
        }
        if row.get("flavor"):
            req["flavor"] = row["flavor"]
        if int(row.get("priority") or 0):
            req["priority"] = int(row["priority"])
        duration: float | None = None
        if first_admit is not None:
            stop = end if end is not None else end_of_window
            start = first_admit
            if row["kind"] == "job" and admits:
                start = admits[-1]  # a requeued job's last run is the complete one
            duration = max(stop - start, 0.0)
            held.setdefault(str(row["kind"]), []).append(duration)
            busy = _busy_intervals(first_admit, stop, moves.get(rid, ()))
            if busy is not None:
                req["busy"] = busy
        elif ended_by == "cancel" and end is not None:
            req["cancel"] = _round(end - t0)
        built.append((req, row, duration))

    requests_out: list[dict[str, Any]] = []
    for req, row, duration in built:
        if duration is None:
            past = held.get(str(row["kind"]))
            duration = statistics.median(past) if past else _DEFAULT_DURATION
        req["duration"] = _round(max(duration, 1.0))
        requests_out.append(req)

    tenants = dict(quotas.get("tenants") or {})
    tenants.update(history.overrides)
    out: dict[str, Any] = {}
    for key in ("flavors", "cohorts"):
        if quotas.get(key):
            out[key] = quotas[key]
    out["tenants"] = tenants
    if quotas.get("policy"):
        out["policy"] = quotas["policy"]
    out["until"] = _round(end_of_window - t0)
    out["requests"] = requests_out
    return out


def read_history(db_url: str, since: float | None, until: float | None) -> StoreHistory:
    """Rows of the requests submitted in [since, until), their decisions and busy/idle
    transitions, and the admins' tenant overrides, read (never written) from the store."""
    from sqlalchemy import create_engine, select

    from .rows import ACTIVITY, DECISIONS, OVERRIDES, REQUESTS

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            q = select(REQUESTS)
            if since is not None:
                q = q.where(REQUESTS.c.submit_time >= since)
            if until is not None:
                q = q.where(REQUESTS.c.submit_time < until)
            requests = [dict(r._mapping) for r in conn.execute(q)]
            ids = [r["id"] for r in requests]
            decisions: list[dict[str, Any]] = []
            activity: list[dict[str, Any]] = []
            for i in range(0, len(ids), 500):  # bounded IN lists
                chunk = ids[i : i + 500]
                decisions += [
                    dict(r._mapping)
                    for r in conn.execute(
                        select(DECISIONS).where(DECISIONS.c.request_id.in_(chunk))
                    )
                ]
                activity += [
                    dict(r._mapping)
                    for r in conn.execute(select(ACTIVITY).where(ACTIVITY.c.request_id.in_(chunk)))
                ]
            overrides = {
                r.name: json.loads(r.spec) for r in conn.execute(select(OVERRIDES)).fetchall()
            }
    finally:
        engine.dispose()
    return StoreHistory(requests, decisions, activity, overrides)


def read_quotas(path: str) -> dict[str, Any]:
    """The quota file a gateway reads, as a mapping; ValueError with a sentence naming
    the file when it cannot be read or is not a mapping of YAML."""
    import yaml

    try:
        quotas = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(quotas, dict):
        raise ValueError(f"{path} must hold a mapping (flavors, tenants, policy)")
    return quotas


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """--db-url, --quotas and --since: which gateway's history, and how far back."""
    parser.add_argument(
        "--db-url", required=True, metavar="URL", help="the gateway's store (its --db-url)"
    )
    parser.add_argument(
        "--quotas", required=True, metavar="FILE", help="the quota file the gateway reads"
    )
    parser.add_argument(
        "--since",
        metavar="SPAN",
        default="30d",
        help="how far back, e.g. 30d, 12h, 90m (default: 30d)",
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "history",
        help="export what a gateway saw as a scenario for `simulate`",
        description="Read a gateway's store and write its requests as a scenario "
        "(docs/SCENARIO.md), with the quotas in force, for `simulate` what-ifs.",
    )
    sub = parser.add_subparsers(dest="history_command", metavar="ACTION")
    export = sub.add_parser(
        "export",
        help="write the gateway's requests as a scenario (YAML on stdout)",
        description="Write the requests a gateway's store holds as a scenario: tenants, "
        "flavors and policy from the quota file plus the admins' overrides in the store; "
        "each request's submit, duration, busy intervals and cancel.",
    )
    add_store_arguments(export)
    export.add_argument(
        "--until", metavar="SPAN", help="stop this long ago (default: now), e.g. 1d"
    )
    export.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    export.add_argument("--json", action="store_true", help="write JSON instead of YAML")
    parser.set_defaults(run=run)
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if getattr(args, "history_command", None) != "export":
        return _error("say what to do: `jupyter-gpuaas history export --help`")
    import yaml

    try:
        since = parse_span(args.since)
        until = parse_span(args.until) if args.until else 0.0
    except ValueError as e:
        return _error(f"--since/--until: {e}")
    try:
        quotas = read_quotas(args.quotas)
    except ValueError as e:
        return _error(f"--quotas: {e}")
    now = time.time()
    from sqlalchemy.exc import SQLAlchemyError

    try:
        history = read_history(args.db_url, now - since, now - until if until else None)
    except SQLAlchemyError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return _error(f"--db-url: cannot read the store: {first}")
    if not history.requests:
        return _error(f"no request was submitted in the last {args.since}: nothing to export")
    scenario = scenario_from_history(quotas, history, now=now - until)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    text = (
        json.dumps(scenario, indent=1) + "\n"
        if args.json
        else f"# {len(history.requests)} requests exported by `jupyter-gpuaas history export` at "
        f"{stamp} (the last {args.since}).\n# Replay: jupyter-gpuaas simulate THIS_FILE "
        "--set KEY=VALUE ...\n" + yaml.safe_dump(scenario, sort_keys=False, default_flow_style=None)
    )
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
