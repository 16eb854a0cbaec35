"""The bound on `GET api/advice`: one replay per `since` at a time, its answer reused for
a while, and a deadline on how long a caller waits for it.

Advice reads a period of the store and replays it through the simulator (advice.py); a
year of a busy gateway takes seconds to minutes. So:

- **Cached per period.** The answer for a `since` (as seconds, so `30d` and `2592000` are
  one entry) is reused for `GatewayApp.advice_cache_seconds`. The replay does not depend
  on who asks (the handler keeps a user's own advice out of the full answer), so one
  replay serves every caller; the cache keys on the period alone.
- **One replay at a time, on threads of its own.** Replays take turns (a lock), on daemon
  threads rather than the default executor the device sampler uses, so a burst of `since`
  values queues here instead of starving the gateway's other work, and a long replay never
  holds up the process's exit (an executor's threads are joined at exit); a second caller
  of a period whose replay is under way waits for that replay rather than starting another.
- **A deadline.** A caller waits at most `GatewayApp.advice_deadline`. Past it, the last
  answer for the period is given, marked `stale` (advice changes slowly: last hour's is
  still worth reading, and its `until` says how old it is); with no answer yet, a 503
  with `Retry-After` and one sentence (`AdviceLate`). Either way the replay goes on and
  its answer is cached for the next caller.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("jupyter_gpuaas.gateway")

#: Periods remembered at once: arbitrary `since` values cannot grow the cache for ever.
MAX_PERIODS = 16


class AdviceLate(Exception):
    """The period's first replay is still under way past the deadline (HTTP 503); ask
    again in `retry_after` seconds (how long it has run so far, from 1 to 60)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the replay is still under way; retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass
class _Entry:
    answer: dict[str, Any] | None = None
    at: float = 0.0  # monotonic time the answer was computed
    running: asyncio.Future[dict[str, Any]] | None = None
    started: float = 0.0


class AdviceCache:
    """Answers for `api/advice` per period (seconds), bounded as the module says."""

    def __init__(self, max_age: float, deadline: float) -> None:
        self.max_age = max_age
        self.deadline = deadline
        self._entries: dict[float, _Entry] = {}
        self._turn = threading.Lock()  # one replay at a time

    async def get(
        self, span: float, compute: Callable[[], dict[str, Any]]
    ) -> tuple[dict[str, Any], bool]:
        """(answer, stale) for the period; `compute` runs (on a thread) only when no fresh
        answer is cached and no replay of the period is under way. AdviceLate past the
        deadline with nothing to show; compute's own error (a store that cannot be read)
        when the replay fails before the deadline."""
        entry = self._entries.get(span)
        now = time.monotonic()
        if entry is not None and entry.answer is not None and now - entry.at < self.max_age:
            return entry.answer, False
        if entry is None:
            self._evict()
            entry = self._entries[span] = _Entry()
        if entry.running is None:
            entry.running = self._start(span, entry, compute)
            entry.started = now
        try:
            answer = await asyncio.wait_for(asyncio.shield(entry.running), self.deadline)
        except asyncio.TimeoutError:
            if entry.answer is not None:
                return entry.answer, True
            waited = time.monotonic() - entry.started
            raise AdviceLate(max(1, min(60, math.ceil(waited)))) from None
        return answer, False

    def _start(
        self, span: float, entry: _Entry, compute: Callable[[], dict[str, Any]]
    ) -> asyncio.Future[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()

        def settle(result: dict[str, Any] | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                assert result is not None
                future.set_result(result)

        def work() -> None:
            result: dict[str, Any] | None = None
            error: BaseException | None = None
            with self._turn:
                try:
                    result = compute()
                except Exception as e:
                    error = e
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the gateway stopped meanwhile: nobody to tell
                pass

        threading.Thread(target=work, name="gpuaas-advice", daemon=True).start()

        def done(f: asyncio.Future[dict[str, Any]]) -> None:
            entry.running = None
            if f.cancelled():
                return
            error = f.exception()
            if error is not None:  # told to whoever waits; the last answer stays
                log.warning("api/advice: the replay of %g s failed: %s", span, error)
                return
            entry.answer, entry.at = f.result(), time.monotonic()

        future.add_done_callback(done)
        return future

    def _evict(self) -> None:
        """Make room for one more period: forget the least recently computed idle ones."""
        idle = sorted((e.at, span) for span, e in self._entries.items() if e.running is None)
        while len(self._entries) >= MAX_PERIODS and idle:
            self._entries.pop(idle.pop(0)[1])
