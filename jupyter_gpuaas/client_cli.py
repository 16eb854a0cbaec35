"""`jupyter-gpuaas status | submit | cancel`: the gateway from a shell, via SyncGatewayClient.

Bad input exits 2 with one line (argparse's); an error answer of the gateway (or no
gateway) prints its message and exits 1. Never a traceback for either.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from jupyter_gpuaas.jobs.cli import positive_int, whole_number
from jupyter_gpuaas.words import about, plural, usage_sentence_of


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("status", help="queue, quotas and my requests, from the gateway")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_status)

    p = subparsers.add_parser("submit", help="run a notebook or script as a GPU job, or ask "
                              "the gateway for GPUs")  # fmt: skip
    p.add_argument("--tenant", help="the tenant (team) to charge (required for a raw request)")
    p.add_argument("--gpus", default=1, type=positive_int, help="how many GPUs (default 1)")
    p.add_argument("--kind", default="job", choices=("server", "kernel", "job"))
    p.add_argument("--flavor", help="a GPU flavor (default: the tenant's, in quota order)")
    p.add_argument(
        "--priority", type=whole_number, default=0, help="higher runs first (in a tenant)"
    )
    p.add_argument("--name", help="a name to recognise the request by")
    p.add_argument("--json", action="store_true", help="print JSON")
    from jupyter_gpuaas.jobs.cli import add_submit_arguments

    add_submit_arguments(p)  # `submit NOTEBOOK.ipynb|SCRIPT.py`: a job (jobs/cli.py)
    p.set_defaults(run=run_submit)

    p = subparsers.add_parser("cancel", help="cancel a queued request or release a grant")
    p.add_argument("id", help="the request id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run_cancel)


def _client() -> Any:
    from jupyter_gpuaas.client import SyncGatewayClient

    return SyncGatewayClient.from_env()


def _guard(fn: Any, args: argparse.Namespace) -> int:
    from jupyter_gpuaas.client import GatewayError

    try:
        return int(fn(args))
    except GatewayError as e:
        print(f"jupyter-gpuaas {args.command}: {e}", file=sys.stderr)
        return 1


def describe(r: dict[str, Any]) -> str:
    what = f"{r['id']} {r['gpus']}× {r.get('flavor') or 'any'} {r['kind']} for {r['tenant']}"
    state = r["state"]
    if state == "admitted" and r.get("grant"):
        g = r["grant"]
        devices = ",".join(map(str, g["devices"]))
        return f"{what}: admitted on {g['node']} devices {devices}"
    if state == "queued" and r.get("position"):
        p = r["position"]
        line = f"{what}: queued, position {p['overall']} of {p['of']}"
        why = (r.get("waiting_for") or {}).get("message")
        wait = r.get("estimated_wait") or {}
        if why:
            line += f"; {why}"
        elif wait.get("seconds") is not None:
            line += f"; estimated wait {about(wait['seconds'])}"
        if r.get("scaling"):
            nodes = plural(r["scaling"]["nodes"], f"{r['scaling']['flavor']} node")
            line += f"; {nodes} coming"
        return line
    reason = f" ({r['reason']})" if r.get("reason") else ""
    return f"{what}: {state}{reason}"


def run_status(args: argparse.Namespace) -> int:
    def go(args: argparse.Namespace) -> int:
        c = _client()
        me, tenants, devices = c.me(), c.tenants(), c.devices()
        mine = c.list(user=me["name"])
        live = [r for r in mine if r["state"] in ("queued", "admitted", "parked", "culled")]
        if args.json:
            print(json.dumps({"me": me, "tenants": tenants, "devices": devices, "requests": mine}))
            return 0
        sim = " (SIMULATED devices)" if devices.get("simulated") else ""
        free = sum(n["free"] for n in devices["nodes"])
        total = sum(n["gpus"] for n in devices["nodes"])
        nodes = plural(len(devices["nodes"]), "node")
        print(f"gateway {c.url}{sim}: {free} of {total} GPUs free on {nodes}")
        print(f"you are {me['name']}; tenants you may charge: {', '.join(me['tenants']) or 'none'}")
        for t in tenants["tenants"]:
            for u in t["usage"]:
                more = int(u.get("pending_gpus") or 0)
                waiting = f"; {plural(more, 'more GPU')} waiting" if more else ""
                print(f"  {usage_sentence_of(t['name'], u)}{waiting}")
        print(f"your live requests: {len(live)}")
        for r in live:
            print("  " + describe(r))
        return 0

    return _guard(go, args)


def run_submit(args: argparse.Namespace) -> int:
    if getattr(args, "source", None):
        from jupyter_gpuaas.jobs.cli import run_submit_job

        return run_submit_job(args)
    if not args.tenant:
        print("jupyter-gpuaas submit: error: a raw request (no NOTEBOOK or SCRIPT) needs "
              "--tenant", file=sys.stderr)  # fmt: skip
        return 2

    def go(args: argparse.Namespace) -> int:
        r = _client().submit(
            args.tenant, args.kind, args.gpus, args.flavor, args.priority, args.name
        )
        print(json.dumps(r) if args.json else describe(r))
        return 0

    return _guard(go, args)


def run_cancel(args: argparse.Namespace) -> int:
    def go(args: argparse.Namespace) -> int:
        r = _client().cancel(args.id)
        print(json.dumps(r) if args.json else describe(r))
        return 0

    return _guard(go, args)
