"""Stalls: time during which the gateway could not act never counts against a holder.

A probe on the loop notices a gap (the process was stopped, or the loop was blocked: its
callbacks ran late by more than `STALL_MIN` seconds), and a store that did not answer is
a gap from its first failure to the next call that succeeds (store_calls.py). Before the
next group runs anything, every live lease is extended by the gaps
(`AdmissionCore.extend_leases`, as etcd's lessor does when it becomes able to act again)
and the extended leases are written with that group: a holder that heartbeat on time
keeps its grant, and one that really died still loses it within one TTL of the gateway
acting again.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("jupyter_gpuaas.gateway")

# The loop's stall probe runs every STALL_PROBE seconds; a gap longer than STALL_MIN
# between two of its observations is time the gateway could not act.
STALL_PROBE = 0.25
STALL_MIN = 1.0


class Stalls:
    """The gap the leases are owed: noticed on the loop, added by the store's outages,
    taken by the next group."""

    def __init__(self) -> None:
        self._last_seen = time.monotonic()
        self._gap = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Probe the loop every STALL_PROBE seconds (on the running loop)."""
        self._last_seen = time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(STALL_PROBE, self._probe)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _probe(self) -> None:
        self.observe()
        self._timer = asyncio.get_running_loop().call_later(STALL_PROBE, self._probe)

    def observe(self) -> None:
        """Note a gap since the last observation (the process or its loop stalled)."""
        now = time.monotonic()
        lag = now - self._last_seen
        self._last_seen = now
        if lag > STALL_MIN:
            log.warning("the gateway could not act for %.1f s: leases are extended", lag)
            self._gap += lag - STALL_PROBE

    def add(self, seconds: float) -> None:
        """A gap noticed elsewhere (the store did not answer for `seconds`)."""
        self._gap += seconds

    def take(self) -> float:
        """The gap owed so far, now included; owed no more."""
        self.observe()
        by, self._gap = self._gap, 0.0
        return by

    def forgive(self) -> None:
        """A restore gave every lease a full TTL from now: no gap is owed any more."""
        self._gap = 0.0
