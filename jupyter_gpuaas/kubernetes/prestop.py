"""The preStop hook of a GPU pod in Kueue mode: SIGTERM held back during a preemption warning.

Kueue evicts a pod of its pod integration by deleting it, and the kubelet sends SIGTERM at
once: the pod's termination grace is only the time between SIGTERM and SIGKILL.
jupyter_server and ipykernel exit on SIGTERM, so without this hook the warning the gateway
gives ("preempted ... in N min", `preempt_at` = eviction + the pod's grace) would be an
upper bound only, and a server's save before the eviction would race its own exit.

The kubelet runs a container's `lifecycle.preStop` hook first and sends SIGTERM when it
returns (or when the grace runs out). This hook asks the gateway for the pod's request
(`GPUAAS_REQUEST_ID`, with the gateway's `GPUAAS_URL` and token that the pod already
carries for its heartbeats):

- a preemption warning stands (`preempt_at`): it waits until `preempt_at` less `margin`
  seconds, so the process still has those seconds for its own SIGTERM shutdown before
  SIGKILL, then returns;
- the request already ended as preempted (the gateway ends it once the pod is gone,
  but one that restarted meanwhile, or an older one that ended it at Kueue's release of
  the quota, may have ended it while the pod still runs, forgetting `preempt_at`). The
  warning said eviction + the pod's grace, and the kubelet runs this hook at the
  eviction, so it waits until its own start + `grace` less `margin`;
- the request is still held (admitted, parked) with no warning yet: Kueue's eviction may
  have raced the gateway's view of it, so it asks again for at most `poll` seconds;
- anything else (released, culled, cancelled: a normal stop) returns at once.

Any error (no gateway, a bad answer) returns at once: the hook never holds a stop up on
its own account, and the kubelet's grace bounds it anyway. `hold_seconds` is the
decision, pure; `main` the thin I/O around it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jupyter_gpuaas.kubeapi.workloads import DEFAULT_GRACE

#: Request states in which a preemption warning may still arrive (the pod holds its GPUs).
HELD_STATES = frozenset({"admitted", "parked"})
#: Seconds before `preempt_at` at which the hook lets SIGTERM through.
DEFAULT_MARGIN = 5.0
#: Seconds the hook asks again for a warning not yet seen while the request is still held.
DEFAULT_POLL = 2.0

MODULE = "jupyter_gpuaas.kubernetes.prestop"


def hold_seconds(
    request: Mapping[str, Any] | None,
    now: float,
    margin: float,
    *,
    started: float | None = None,
    grace: float = DEFAULT_GRACE,
) -> float | None:
    """How long to hold SIGTERM back, given the pod's request (the gateway's JSON) at
    `now` (epoch seconds): the seconds until `preempt_at` less `margin` (0 when past, and
    never past `started` + `grace` less `margin`, the pod's own grace); a
    request ended as preempted, until `started` (the hook's start, `now` if not given) +
    `grace` less `margin`; `None` while the request is held with no warning yet (ask
    again); 0 otherwise."""
    if not isinstance(request, Mapping):
        return 0.0
    begun = now if started is None else started
    # Never past the pod's own grace from the hook's start: a `preempt_at` later than that
    # (the gateway's clock ahead of the node's) would only be cut short by SIGKILL.
    last = begun + grace - margin
    at = request.get("preempt_at")
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return max(0.0, min(float(at) - margin, last) - now)
    if request.get("state") == "preempted":
        return max(0.0, last - now)
    if request.get("state") in HELD_STATES:
        return None
    return 0.0


def prestop_lifecycle(
    python: str = "python", margin: float = DEFAULT_MARGIN, grace: float = DEFAULT_GRACE
) -> dict[str, Any]:
    """The container's `lifecycle` that runs this hook (Kubernetes' API JSON form);
    `grace`: the pod's terminationGracePeriodSeconds."""
    command = [python, "-m", MODULE, "--margin", f"{margin:g}", "--grace", f"{grace:g}"]
    return {"preStop": {"exec": {"command": command}}}


def wait_out(
    fetch: Callable[[], Mapping[str, Any] | None],
    *,
    margin: float = DEFAULT_MARGIN,
    poll: float = DEFAULT_POLL,
    grace: float = DEFAULT_GRACE,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Hold as `hold_seconds` decides, asking `fetch` again while it says `None` for at
    most `poll` seconds; the seconds it held. `fetch` raising ends the hold at once."""
    start = clock()
    while True:
        try:
            request = fetch()
        except Exception as e:  # no gateway, a refusal, a bad answer: never hold a stop
            print(f"gpuaas preStop: cannot read the request ({e}); stopping now", file=sys.stderr)
            return clock() - start
        now = clock()
        wait = hold_seconds(request, now, margin, started=start, grace=grace)
        if wait is None:
            if now - start >= poll:
                print("gpuaas preStop: no preemption warning; stopping now", file=sys.stderr)
                return now - start
            sleep(min(0.25, poll))
            continue
        if wait > 0:
            print(f"gpuaas preStop: preempted; stopping in {wait:.0f} s", file=sys.stderr)
            sleep(wait)
        else:
            state = request.get("state") if isinstance(request, Mapping) else None
            print(f"gpuaas preStop: the request is {state}; stopping now", file=sys.stderr)
        return clock() - start


def _fetch(env: Mapping[str, str], rid: str, timeout: float) -> Mapping[str, Any]:
    from jupyter_gpuaas.client import GatewayClient

    client = GatewayClient.from_env(env, timeout=timeout)
    return dict(asyncio.run(client.get(rid)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL)
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE)
    args = parser.parse_args(argv)
    rid = os.environ.get("GPUAAS_REQUEST_ID", "")
    if not rid:
        return 0  # a pod without a GPU request: nothing to wait for
    env = dict(os.environ)
    wait_out(lambda: _fetch(env, rid, 2.0), margin=args.margin, poll=args.poll, grace=args.grace)
    return 0  # a failed hook only adds a warning event: always succeed


if __name__ == "__main__":
    sys.exit(main())
