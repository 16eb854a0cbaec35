"""Server-Sent Events: the bus that fans committed decisions out to listeners.

The arbiter publishes only after the transaction that recorded a decision committed, so a
listener never hears of a state the database might not have. Each listener has its own
bounded backlog and sees what its caller may see: a listener bound to an `owner` hears the
events about that user's requests (and those about no request); one without an owner hears
everything its `allow` filter passes (viewers and admins: everything). Owners are indexed,
so publishing an event costs the listeners that get it, not all of them. An event is
encoded once, whoever hears it. A listener that falls too far behind is dropped rather than
letting memory grow without bound: its backlog is bounded in events and in bytes, and a
listener over either bound is handed one `reset` event and its stream ends (it reconnects
and re-reads state from `GET api/requests`), so a slow client never slows the decision
loop nor holds more than its bound.

The streams that hear everything unfiltered (viewers' and admins': "log readers") hold no
buffer of their own: the bus keeps one log of the last events' bytes and each reader
only the sequence number it was last written up to. Publishing an event costs them
nothing each (a thousand of them cost what one does); a round hands each reader the
bytes from its number to the newest, joined once for all the readers at the same number
(after a round, all of them). The bound is kept in the same terms: the readers at the
oldest number are dropped when the log past it exceeds a listener's bound.

Writing to a stream costs the loop tens of microseconds, so with a thousand streams that
hear every event (viewers') a round of writes takes tens of milliseconds. Their rounds are
spaced by their own cost (`fanout_spacing` seconds per stream written in the last round,
250 µs: with 1,000 such streams a round every 250 ms, at most 4,000 writes a second however
many there are), so submissions keep their answers' latency and those streams their
events, only later and in bigger writes. An owner's stream (a holder's) has rounds of its
own, every `coalesce` seconds, and hears of its admission at once.

Every event carries an SSE `id:` (`<boot>-<sequence>`; `boot` is random per gateway
process). The bus keeps the last `replay_window` events, as their encoded bytes and owner
only (no objects for the collector to walk). A client reconnecting with `Last-Event-ID`
gets exactly the events it missed that it may see, in order, before anything new; when
they are no longer all in the window (or the id is of another gateway process, or
unknown), it gets one `reset` event instead, telling it to relist. A fresh stream's
`: connected` block carries the current id, so even a client that has heard nothing yet
can resume. A `Last-Event-ID` that is no id at all (longer than `ID_MAX` characters, or
not printable ASCII) is refused before any listener exists (`check_last_event_id`; the
stream answers 400): a 4,301-digit id costs one sentence, not a listener.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import math
import re
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("jupyter_gpuaas.gateway")

#: The longest `Last-Event-ID` taken: ours are `<8 hex>-<sequence>`, about 30 characters.
ID_MAX = 64
_ID_CHARS = re.compile(r"[\x21-\x7e]*")  # printable ASCII, no space


def check_last_event_id(value: str) -> str:
    """The Last-Event-ID header's value, stripped; ValueError (one sentence) when it is no
    id at all. A well-formed id this gateway never gave is not an error: it is answered
    with a `reset` (the client relists), as an id of a restarted gateway is."""
    text = value.strip()
    if len(text) > ID_MAX:
        raise ValueError(
            f"Last-Event-ID is {len(text)} characters long; an event id of this gateway "
            f"is at most {ID_MAX}: reconnect without it and list the requests again"
        )
    if not _ID_CHARS.fullmatch(text):
        raise ValueError(
            "Last-Event-ID must be printable ASCII without spaces (an id this gateway "
            "sent): reconnect without it and list the requests again"
        )
    return text


@dataclass(frozen=True)
class Event:
    """One SSE event: `name` is the decision (admit, cull_warning, ...), `data` its JSON."""

    name: str
    data: dict[str, Any]
    user: str | None = None  # owner of the request it is about; None: about no request
    id: str = ""  # the SSE id, given by the bus when it publishes the event

    @functools.cached_property
    def wire(self) -> bytes:
        """The event as sent (encoded once however many listeners hear it)."""
        head = f"id: {self.id}\n" if self.id else ""
        return f"{head}event: {self.name}\ndata: {json.dumps(self.data)}\n\n".encode()

    @classmethod
    def replayed(cls, name: str, user: str | None, event_id: str, wire: bytes) -> Event:
        """An event of the replay window: its bytes as first sent, without its data."""
        event = cls(name, {}, user, event_id)
        event.__dict__["wire"] = wire  # the cached_property's slot
        return event

    def encode(self) -> bytes:
        return self.wire


Filter = Callable[[Event], bool]


class Listener:
    """One stream: events wait in `pending` (or, for a log reader, in the bus's log) and
    `deliver()` is called to send them.

    The bus calls `deliver` once per round for each listener that has events (every event
    published meanwhile in one write), not once per event, and nothing waits on a task per
    listener. `ready` wakes the stream's handler only to end it (closed, dropped) or for
    its keepalive timer.
    """

    def __init__(
        self,
        deliver: Callable[[], None],
        allow: Filter | None,
        maxsize: int,
        owner: str | None = None,
        maxbytes: int = 1 << 20,
        bus: EventBus | None = None,
    ) -> None:
        self.deliver = deliver
        self.allow = allow
        self.owner = owner
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self.pending: list[Event] = []
        self.pending_bytes = 0
        self.ready = asyncio.Event()
        self.dropped = False
        self.closed = False
        # A log reader reads the bus's log from `mark` (the sequence number it was last
        # written up to) instead of having events put in `pending` one by one.
        self.bus = bus
        self.mark: _Mark | None = None

    @property
    def ended(self) -> bool:
        return self.closed or self.dropped

    @property
    def behind(self) -> bool:
        """Whether anything waits to be sent to it."""
        return bool(self.pending) or (
            self.mark is not None and self.bus is not None and self.mark.seq < self.bus.seq
        )

    def put(self, event: Event) -> bool:
        """Buffer an event; False when the listener is too far behind (drop it)."""
        size = len(event.wire)
        if len(self.pending) >= self.maxsize or self.pending_bytes + size > self.maxbytes:
            return False
        self.pending.append(event)
        self.pending_bytes += size
        return True

    def take(self) -> list[Event]:
        """Everything it has not been sent, in order; from now on it is sent."""
        events, self.pending = self.pending, []
        self.pending_bytes = 0
        if self.mark is not None and self.bus is not None:
            events += self.bus._read_log(self)[0]
        return events

    def take_wire(self) -> bytes:
        """The same as one write's bytes: a reader's shared with every reader that was
        at the same point (one bytes object, not one per stream)."""
        head = b"".join(e.wire for e in self.pending) if self.pending else b""
        self.pending = []
        self.pending_bytes = 0
        if self.mark is None or self.bus is None:
            return head
        wire = self.bus._read_log(self, wire=True)[1]
        return head + wire if head else wire

    def end(self, *, dropped: bool = False) -> None:
        self.dropped = self.dropped or dropped
        self.closed = self.closed or not dropped
        self.ready.set()

    async def wait(self, timeout: float) -> bool:
        """Wait until the listener ends; False after `timeout` seconds (keepalive time).

        A timer, not `wait_for`: no task per wait.
        """
        if self.ended:
            return True
        self.ready.clear()
        timer = asyncio.get_running_loop().call_later(timeout, self.ready.set)
        try:
            await self.ready.wait()
        finally:
            timer.cancel()
        return self.ended


class _Mark:
    """The readers that were written up to the event `seq` (`cum`: the log's running
    byte count after it)."""

    __slots__ = ("cum", "listeners", "seq")

    def __init__(self, seq: int, cum: int) -> None:
        self.seq = seq
        self.cum = cum
        self.listeners: set[Listener] = set()


class EventBus:
    """Fans events out to listeners.

    Deliveries are batched in time: a listener's stream is written at most once per
    `coalesce` seconds (every event published meanwhile in one write), a reader's at
    most once per `fanout_spacing` x the readers written in the last round. Under load
    that divides the writes to many streams several times over for a few ms of delay
    (owners') or a fraction of a second (readers'). After a quiet period the first
    events go out on the loop's next turn, not a period later: a holder waiting for its
    admission hears of it at once (the events of one operation still go together,
    published before the loop turns).
    """

    def __init__(
        self,
        maxsize: int = 1000,
        coalesce: float = 0.01,
        chunk: int = 50,
        turn: float = 0.002,
        replay_window: int = 10_000,
        maxbytes: int = 1 << 20,
        fanout_spacing: float = 250e-6,
    ) -> None:
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self.coalesce = coalesce
        self.chunk = chunk
        self.turn = turn  # seconds of writes a loop turn, at most
        self.dropped = 0  # listeners dropped for falling behind, since start
        self.boot = secrets.token_hex(4)
        self.seq = 0
        # (seq, name, owner, wire) of the last `replay_window` events
        self.window: deque[tuple[int, str, str | None, bytes]] = deque(maxlen=replay_window)
        self.listeners: set[Listener] = set()
        self._everything: set[Listener] = set()  # no owner, a filter: `allow` each event
        self._by_owner: dict[str, set[Listener]] = {}
        # The readers' log: the events after `_base` (their running byte count in `_cum`,
        # `_total` after the newest), and the readers by the point they were written up
        # to, oldest first (a reader only ever moves to the newest point).
        self._log: list[Event] = []
        self._cum: list[int] = []
        self._base = 0
        self._total = 0
        self._marks: dict[int, _Mark] = {}
        self._joined: dict[tuple[int, int], bytes] = {}  # (from, to): the bytes, per round
        # Listeners with events to write, in two classes with rounds of their own: the
        # owners' streams every `coalesce` seconds (a holder hears of its admission at
        # once), the streams that hear everything spaced by the cost of their last round.
        self._owners = _Rounds(self, spacing=0.0)
        self._wide = _Rounds(self, spacing=fanout_spacing, log_readers=True)

    def subscribe(
        self,
        deliver: Callable[[], None],
        allow: Filter | None = None,
        *,
        owner: str | None = None,
        last_event_id: str | None = None,
    ) -> Listener:
        """A listener: bound to `owner`'s requests, or to everything `allow` passes.

        `deliver()` is called (on the loop) when events are pending for it. With
        `last_event_id` (a reconnecting client's Last-Event-ID) the events it missed are
        pending at once, or a `reset` event when they cannot all be replayed; one that is
        no id at all raises ValueError before anything is registered.
        """
        if last_event_id is not None:
            last_event_id = check_last_event_id(last_event_id)
        listener = Listener(deliver, allow, self.maxsize, owner, self.maxbytes, self)
        self.listeners.add(listener)
        if owner is not None:
            self._by_owner.setdefault(owner, set()).add(listener)
        elif allow is not None:
            self._everything.add(listener)
        else:  # a reader: from the newest event on (what it missed is its replay)
            self._move(listener)
        if last_event_id is not None:
            self._replay(listener, last_event_id)
        return listener

    @property
    def last_id(self) -> str:
        """The id of the last event published (what a new stream resumes from)."""
        return f"{self.boot}-{self.seq}"

    def _replay(self, listener: Listener, last_event_id: str) -> None:
        """Queue what `listener` missed since `last_event_id`, or a `reset`."""
        boot, _, seq_text = last_event_id.partition("-")
        # At most ID_MAX characters (checked): int() never meets its 4,300-digit limit.
        seq = int(seq_text) if seq_text.isascii() and seq_text.isdigit() else -1
        oldest = self.window[0][0] if self.window else self.seq + 1
        why = None
        if boot != self.boot or not 0 <= seq <= self.seq:
            why = "the gateway restarted, or the id is not one of its events"
        elif seq + 1 < oldest:
            why = f"more events happened than the gateway keeps ({self.window.maxlen})"
        elif listener.allow is not None:
            why = "this stream filters events, which the window cannot"
        missed: list[Event] = []
        if why is None:
            owner = listener.owner
            for n, name, user, wire in self.window:
                if n > seq and (owner is None or user is None or user == owner):
                    missed.append(Event.replayed(name, user, f"{self.boot}-{n}", wire))
            if len(missed) > listener.maxsize:
                why = f"more than {listener.maxsize} events were missed"
            elif sum(len(e.wire) for e in missed) > listener.maxbytes:
                why = f"more than {listener.maxbytes // 1024} KiB of events were missed"
        if why is not None:
            missed = [self._reset(f"cannot replay the events after {last_event_id!r}: {why}")]
        for event in missed:
            listener.put(event)
        if missed:
            self._rounds_of(listener).pending[listener] = None
            self._schedule()

    def requeue(self, listener: Listener) -> None:
        """A stream that could not be written in its round (a write was in flight) goes in
        its class's next round. A reader behind the log alone needs no entry: every round
        writes the readers behind the log (its own events, a replay, do)."""
        if listener.ended:
            return
        if listener.mark is None or listener.pending:
            self._rounds_of(listener).pending[listener] = None
        self._schedule()

    def _rounds_of(self, listener: Listener) -> _Rounds:
        return self._wide if listener.owner is None else self._owners

    def _reset(self, why: str) -> Event:
        data = {"reason": why + "; list the requests again", "id": None}
        return Event("reset", data, None, self.last_id)

    def unsubscribe(self, listener: Listener) -> None:
        self.listeners.discard(listener)
        self._everything.discard(listener)
        self._rounds_of(listener).pending.pop(listener, None)
        self._unmark(listener)
        if listener.owner is not None:
            mine = self._by_owner.get(listener.owner)
            if mine is not None:
                mine.discard(listener)
                if not mine:
                    del self._by_owner[listener.owner]

    def publish(self, event: Event) -> None:
        self.seq += 1
        event = dataclasses.replace(event, id=f"{self.boot}-{self.seq}")
        wire = event.wire
        if self.window.maxlen:
            self.window.append((self.seq, event.name, event.user, wire))
        # Owners' streams first: a holder waiting for its admission is written before the
        # viewers' streams of the same round.
        if event.user is None:
            targets: Iterable[Listener] = [
                *(x for mine in self._by_owner.values() for x in mine),
                *self._everything,
            ]
        else:
            targets = [*self._by_owner.get(event.user, ()), *self._everything]
        owners, wide = self._owners.pending, self._wide.pending
        for listener in targets:
            if listener.allow is not None and not listener.allow(event):
                continue
            if listener.put(event):
                (wide if listener.owner is None else owners)[listener] = None
            else:
                self.drop(listener)
        if self._marks:  # readers: the log, and the bound of the oldest of them
            self._total += len(wire)
            self._log.append(event)
            self._cum.append(self._total)
            self._drop_laggards()
        else:  # nobody reads the log: it starts after this event
            self._base = self.seq
        self._schedule()

    def drop(self, listener: Listener) -> None:
        """End a listener that fell behind: what it has not been sent is replaced by one
        `reset` (its stream sends it and ends; the client relists), so it holds nothing
        more and the loop spends nothing more on it."""
        self.dropped += 1
        behind = len(listener.pending)
        held = listener.pending_bytes
        if listener.mark is not None:
            behind += self.seq - listener.mark.seq
            held += self._total - listener.mark.cum
        log.warning("dropping a slow event listener (%d events, %d bytes behind)", behind, held)
        self.unsubscribe(listener)
        listener.take()
        why = "the stream fell too far behind (its client did not read fast enough)"
        listener.put(self._reset(why))
        listener.end(dropped=True)

    # --- the log and its readers ---------------------------------------------------------

    def _move(self, listener: Listener) -> None:
        """Mark `listener` as written up to the newest event."""
        self._unmark(listener)
        mark = self._marks.get(self.seq)
        if mark is None:
            mark = self._marks[self.seq] = _Mark(self.seq, self._total)
        mark.listeners.add(listener)
        listener.mark = mark

    def _unmark(self, listener: Listener) -> None:
        mark, listener.mark = listener.mark, None
        if mark is not None:
            mark.listeners.discard(listener)
            if not mark.listeners:
                del self._marks[mark.seq]
                self._trim()

    def _read_log(self, listener: Listener, *, wire: bool = False) -> tuple[list[Event], bytes]:
        """What reader `listener` has not been sent (its events, or their joined bytes),
        after which it is marked as sent up to the newest event."""
        mark = listener.mark
        assert mark is not None
        start, end = mark.seq, self.seq
        if start == end:
            return [], b""
        first = start - self._base  # index in the log of the event after `start`
        events: list[Event] = []
        joined = b""
        if not wire:
            events = self._log[first : end - self._base]
        else:
            key = (start, end)
            joined = self._joined.get(key, b"")
            if not joined:
                if end - start == 1:
                    joined = self._log[first].wire
                else:
                    joined = b"".join(e.wire for e in self._log[first : end - self._base])
                self._joined[key] = joined
        self._move(listener)  # (after reading: the log may forget what it was behind)
        return events, joined

    def _drop_laggards(self) -> None:
        """Drop the readers past a listener's bound (the oldest first)."""
        while self._marks:
            mark = next(iter(self._marks.values()))
            if self.seq - mark.seq <= self.maxsize and self._total - mark.cum <= self.maxbytes:
                return
            for listener in list(mark.listeners):
                self.drop(listener)  # unmarks it (the mark goes with its last reader)

    def _trim(self) -> None:
        """Forget the log's events that every reader has been sent."""
        oldest = next(iter(self._marks)) if self._marks else self.seq
        n = oldest - self._base
        if n > 0 and (not self._marks or n >= 64 or n * 2 >= len(self._log)):
            del self._log[:n]
            del self._cum[:n]
            self._base = oldest

    def readers_behind(self) -> list[Listener]:
        """The readers with events they have not been sent (for a round)."""
        out: list[Listener] = []
        for seq, mark in self._marks.items():
            if seq < self.seq:
                out.extend(mark.listeners)
        return out

    def _schedule(self) -> None:
        self._owners.schedule()
        self._wide.schedule()

    def close(self) -> None:
        """Wake every listener so its handler can finish (on shutdown)."""
        for listener in list(self.listeners):
            self.unsubscribe(listener)
            listener.end()


class _Rounds:
    """One class of listeners with pending events, handed to their streams in rounds.

    A round begins `period` after the last one began: at once when that is past (a lone
    event is not held back), else when it ends (one write per stream per period under
    load). The period is `coalesce`, or the last round's cost (`spacing` seconds per
    stream written) when that is longer. A round writes `chunk` streams per loop turn
    (fewer when they took over `turn` seconds), so requests waiting for the loop (a
    submission's 201) go in between. The rounds of `log_readers` also write every reader
    of the bus's log that is behind it.
    """

    def __init__(self, bus: EventBus, spacing: float, log_readers: bool = False) -> None:
        self.bus = bus
        self.spacing = spacing
        self.log_readers = log_readers
        self.pending: dict[Listener, None] = {}  # ordered set
        self.round: list[Listener] = []  # what is left of the round in progress
        self.scheduled = False
        self.last_flush = -math.inf  # the loop's time when the last round began
        self.last_round = 0  # streams written in the last round

    def _has_work(self) -> bool:
        if self.pending:
            return True
        if not self.log_readers or not self.bus._marks:
            return False
        return next(iter(self.bus._marks)) < self.bus.seq  # the oldest reader is behind

    def schedule(self) -> None:
        if not self.scheduled and self._has_work():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (nobody is listening yet)
                return
            period = max(self.bus.coalesce, self.spacing * self.last_round)
            wait = self.last_flush + period - loop.time()
            if wait > 0:
                loop.call_later(wait, self.flush)
            else:
                loop.call_soon(self.flush)
            self.scheduled = True

    def flush(self) -> None:
        self.last_flush = asyncio.get_running_loop().time()
        self.round = list(self.pending)
        self.pending.clear()
        if self.log_readers:
            self.round += self.bus.readers_behind()
            self.bus._joined.clear()
        self.last_round = len(self.round)
        self._deliver_some()

    def _deliver_some(self) -> None:
        # At most `chunk` streams and `turn` seconds a loop turn: on a busy machine a
        # write can take far longer than its CPU time, and a submission waiting for the
        # loop should wait for one short turn, not for 50 slow writes.
        chunk, self.round = self.round[: self.bus.chunk], self.round[self.bus.chunk :]
        until = time.perf_counter() + self.bus.turn
        for i, listener in enumerate(chunk):
            if listener.ended:
                continue
            try:
                listener.deliver()
            except Exception:
                log.exception("event delivery failed")
                self.bus.unsubscribe(listener)
                listener.end()
            if time.perf_counter() > until:
                self.round[:0] = chunk[i + 1 :]
                break
        if self.round:
            asyncio.get_running_loop().call_soon(self._deliver_some)
        else:
            self.scheduled = False
            self.schedule()  # what was published during the round
