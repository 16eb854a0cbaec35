"""The words people read: durations, waits, usage and errors, built in one place. PURE.

Every view (the gateway's API text fields, the Hub's spawn form and pending page, the
server extension's pages, `jupyter-gpuaas status`, `%gpu status`, the simulator's report)
builds its sentences here, so the same wait reads the same everywhere ("about 4 min", not
"4 min" here and "3m 58s" there). No I/O and no clock: whoever knows the time passes it in.
The admission core never imports this module (it stays free of the package); the gateway
turns the core's numbers into words.

    >>> format_duration(238)
    '4 min'
    >>> usage_sentence("vision", "a100", used=4, quota=2, lenders=["nlp"])
    'vision uses 4 a100: 2 of its own and 2 borrowed from nlp'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFERRED_KERNEL",
    "Release",
    "about",
    "about_field",
    "another_user",
    "culled_reason",
    "ended_by",
    "ended_words",
    "ending_sentence",
    "eta_phrase",
    "expired_reason",
    "format_duration",
    "gpus_taken",
    "holder",
    "join_names",
    "plural",
    "preempted_reason",
    "reason_sentence",
    "usage_phrase",
    "usage_phrase_of",
    "usage_sentence",
    "usage_sentence_of",
    "wait_sentence",
]


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 GPU`, `2 GPUs`, `0 requests`; `many` for irregular nouns."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def join_names(names: Iterable[str]) -> str:
    """`nlp`, `nlp and ops`, `nlp, ops and vision`."""
    items = list(names)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def format_duration(seconds: float | None) -> str:
    """A duration for people: `45 s`, `12 min`, `3 h 20 min`, `2 d 3 h`; `unknown` for None.

    Each unit is rounded to the nearest whole one, and a value that rounds up to the next
    unit is shown in it (59.6 s is `1 min`, 3599 s is `1 h`). Negative is 0.
    """
    if seconds is None:
        return "unknown"
    seconds = max(0.0, float(seconds))
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(round(seconds / 3600), 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def about(seconds: float) -> str:
    """An estimate: `about 12 min`, or `less than a minute` (an estimate in seconds would
    promise more precision than any estimate has)."""
    if seconds < 60:
        return "less than a minute"
    return f"about {format_duration(seconds)}"


#: First words of a problem that needs its field in front to be a sentence.
_PREDICATES = frozenset(
    ("must", "is", "are", "may", "needs", "cannot", "should", "has", "at", "not", "only")
)


def about_field(field: str | None, problem: str) -> str:
    """One sentence that names the field: ("gpus", "must be at least 1") → "gpus must be at
    least 1". A problem that is already a sentence (it does not start with a predicate such
    as "must" or "is") is left as it is."""
    if not field or not problem:
        return problem or (f"{field} is not valid" if field else "")
    first = problem.split(" ", 1)[0]
    if first in _PREDICATES:
        return f"{field} {problem}"
    return problem


def usage_sentence(
    tenant: str,
    flavor: str,
    *,
    used: int,
    quota: int,
    lenders: Iterable[str] = (),
    parked: int = 0,
) -> str:
    """What a tenant holds of a flavor, borrowing said as borrowing:
    `vision uses 4 a100: 2 of its own and 2 borrowed from nlp`.

    `used` counts every GPU it holds (parked ones too, as the quota does); `lenders` are
    the cohort members its borrowed GPUs come from.
    """
    return (
        f"{tenant} {usage_phrase(flavor, used=used, quota=quota, lenders=lenders, parked=parked)}"
    )


def usage_phrase(
    flavor: str, *, used: int, quota: int, lenders: Iterable[str] = (), parked: int = 0
) -> str:
    """`usage_sentence` without its subject (`uses 2 of its 4 a100`), for a line that
    already names the tenant."""
    names = join_names(lenders) or "its cohort"
    borrowed = max(0, used - quota)
    if borrowed:
        own = used - borrowed
        if own == 0:
            text = f"uses {used} {flavor}, all borrowed from {names}"
        else:
            text = f"uses {used} {flavor}: {own} of its own and {borrowed} borrowed from {names}"
    elif used == 0:
        text = f"uses none of its {quota} {flavor}" if quota else f"has no {flavor} quota"
    elif used == quota:
        text = f"uses all {quota} of its {flavor}" if quota > 1 else f"uses its only {flavor}"
    else:
        text = f"uses {used} of its {quota} {flavor}"
    if parked:
        text += f" ({parked} of them parked for a culled kernel or server)"
    return text


def _usage_args(usage: Mapping[str, Any]) -> dict[str, Any]:
    parked = int(usage.get("parked") or 0)
    return {
        "used": int(usage.get("admitted") or 0) + parked,
        "quota": int(usage.get("quota") or 0),
        "lenders": list(usage.get("borrowed_from") or ()),
        "parked": parked,
    }


def usage_sentence_of(tenant: str, usage: Mapping[str, Any]) -> str:
    """`usage_sentence` from one entry of the gateway's `api/tenants` usage list."""
    return f"{tenant} {usage_phrase_of(usage)}"


def usage_phrase_of(usage: Mapping[str, Any]) -> str:
    """`usage_phrase` from one entry of the gateway's `api/tenants` usage list."""
    return usage_phrase(str(usage.get("flavor")), **_usage_args(usage))


def holder(user: str, kind: str) -> str:
    """`alice's job`, `bob's server`."""
    return f"{user}'s {kind}"


@dataclass(frozen=True)
class Release:
    """The next grant expected to free a GPU: whose, and in how many seconds.

    `idle`: it ends because the idle culler takes it (known), else because grants of its
    flavor are held about that long on average (a guess). `user` None: another user's
    grant, said as "another user of <tenant>" (the view rule: a wait sentence is read by
    the waiting request's owner, who may not see other users' names, as in api/devices).
    """

    user: str | None
    kind: str
    seconds: float
    idle: bool = False
    tenant: str = ""

    def phrase(self) -> str:
        when = about(self.seconds)
        if self.user is None:
            someone = another_user(self.tenant)
            if self.idle:
                return f"when an idle {self.kind} of {someone} is culled ({when})"
            verb = "ends" if self.kind == "job" else "stops"
            return f"when a {self.kind} of {someone} {verb} ({when})"
        if self.idle:
            return f"when {self.user}'s idle {self.kind} is culled ({when})"
        verb = "ends" if self.kind == "job" else "stops"
        return f"when {holder(self.user, self.kind)} {verb} ({when})"


def another_user(tenant: str) -> str:
    """Another user, named only by tenant: what one without the view scope reads."""
    return f"another user of {tenant}" if tenant else "another user"


def wait_sentence(
    *,
    flavor: str,
    total: int,
    free: int,
    gpus: int,
    ahead: int = 0,
    release: Release | None = None,
    turn: float | None = None,
    quota: str = "",
    why: str = "",
    eta: str = "",
) -> str:
    """Why a queued request waits, and until when, in one line: THE wait sentence, which
    every view shows as it is (the API's `waiting_for.message`), adding nothing to it.

    `total`/`free`: the devices of the flavor(s) it may use; `ahead`: requests before it;
    `release`: the next grant to free a device (None: none has a known end); `turn`: the
    estimated seconds until its own turn; `quota`: the tenant's usage sentence, said when
    devices are free but the tenant may not take them; `why`: the core's reason
    (reason_sentence), said instead of all that guessing when given; `eta`: the estimate
    of a forward run of the queue (`eta_phrase`), said instead of `release` and `turn`.

        waiting: all 4 a100 are in use; the next one frees when alice's job ends (about 12 min)
        waiting: all 4 a100 are in use; no estimate yet
    """
    if why:  # the core's reason (reason_sentence) says it: only the estimate follows
        head = f"waiting: {why}"
    elif free >= gpus and ahead:
        head = f"waiting: {plural(ahead, 'request')} ahead in the queue"
    elif free >= gpus:
        head = f"waiting for quota: {quota}" if quota else "waiting for its turn"
    elif free == 0:
        head = (
            f"waiting: the only {flavor} is in use"
            if total == 1
            else f"waiting: all {total} {flavor} are in use"
        )
    else:
        verb = "is" if free == 1 else "are"
        head = f"waiting: {free} of {total} {flavor} {verb} free and it needs {gpus}"
        if ahead:
            head += f", {plural(ahead, 'request')} ahead"
    if eta:
        # Its turn is an idle grant's cull, a known time: said as that grant's end.
        if (
            release is not None
            and release.idle
            and turn is not None
            and abs(turn - release.seconds) < 60
        ):
            return f"{head}; the next one frees {release.phrase()}"
        return f"{head}; {eta}"
    if release is None:
        return f"{head}; no estimate yet"
    text = f"{head}; the next one frees {release.phrase()}"
    if turn is not None and turn - release.seconds >= 60:
        text += f"; its turn in {about(turn)}"
    return text


def eta_phrase(
    seconds: float | None, low: float | None, high: float | None, *, confidence: str = ""
) -> str:
    """When a queued request is expected to start, from a forward run of the queue
    (gateway `estimated_wait`): `likely in about 25 min (15 min to 40 min)`; `in about 29 min`
    when every run agrees (an idle grant's cull, a known time); `likely within a minute`;
    `no estimate yet` for None. `confidence` "low" (few past grants to go by) says so.

        >>> eta_phrase(1500, 900, 2400)
        'likely in about 25 min (15 min to 40 min)'
        >>> eta_phrase(1740, 1740, 1740)
        'in about 29 min'
    """
    if seconds is None:
        return "no estimate yet"
    if seconds < 60 and high is not None and high < 60:
        return "likely within a minute"
    lo = format_duration(low if low is not None else seconds)
    hi = format_duration(high) if high is not None else None
    when = "within a minute" if seconds < 60 else f"in {about(seconds)}"
    if hi is None:
        text = f"likely {when} ({lo} or more)"
    elif lo == hi == format_duration(seconds):
        text = f"in {about(seconds)}"
    else:
        text = f"likely {when} ({lo} to {hi})"
    if confidence == "low":
        text += ", a rough guess: few past grants to go by"
    return text


def reason_sentence(kind: str, details: Mapping[str, Any]) -> str:
    """Why a queued request waits, from the core's typed reason (`core.waiting_for`):

    vision uses 4 of 4 a100 and the cohort lends none
    no a100 node has 2 free GPUs; 1 node being added
    behind r7, the first request of vision, which goes first (StrictFIFO)
    """
    if "sentence" in details:  # said in words already (Kueue's reasons: kubeapi/workloads.py)
        return str(details["sentence"])
    tenant, flavor, gpus = details.get("tenant", ""), details.get("flavor", ""), details["gpus"]
    head = details.get("head")
    if kind == "fifo":
        return f"behind {head}, the first request of {tenant}, which goes first (StrictFIFO)"
    if kind == "capacity":
        text = f"no {flavor} node has {gpus} free {'GPU' if gpus == 1 else 'GPUs'}"
        coming = int(details.get("coming", 0))
        if coming:
            text += f"; {plural(coming, 'node')} being added"
    else:
        used, nominal, lend = details["used"], details["nominal"], int(details.get("lendable", 0))
        text = f"{tenant} {usage_phrase(flavor, used=used, quota=nominal)}"
        if not details.get("cohort"):
            text += f" and it asks for {gpus}" if used < nominal else ""
        elif int(details.get("lent_out", 0)):
            lent = int(details["lent_out"])
            text += f" and {lent} of them {'is' if lent == 1 else 'are'} lent out in the cohort"
        elif lend == 0:
            text += (
                " and the cohort lends none" if used <= nominal else " and the cohort lends no more"
            )
        else:
            text += f" and the cohort lends {lend} of the {gpus} it needs"
    if head:
        text += f" ({head}, of the same size, is ahead of it)"
    return text


# --- endings: who or what ended a request, and why --------------------------------------
#
# The gateway stores a request's end as a short reason in these words ("cancelled by an
# admin (root)", "preempted: nlp took back its GPU", "culled: idle on its GPU for 30 min");
# `ended_words` reads one for a history row and `ending_sentence` makes the one sentence
# the spawn page, the sidebar and `%gpu status` show. No HTTP code, no request id.

ADMIN_PREFIX = "an admin"


def ended_by(verb: str, who: str, owner: str) -> str:
    """The reason stored when `who` cancels or releases `owner`'s request: `cancelled by
    alice`, `released by an admin (root)`."""
    return f"{verb} by {who}" if who == owner else f"{verb} by {ADMIN_PREFIX} ({who})"


def gpus_taken(gpus: int, needed: int | None = None, whose: str = "its") -> str:
    """Which of a preempted request's `gpus` GPUs were wanted, counted as far as the
    gateway knows: `needed` is how many the preemptor asked for (None: unknown).

        >>> gpus_taken(1), gpus_taken(4, 4), gpus_taken(4, 1), gpus_taken(4, 1, "the")
        ('its GPU', 'its 4 GPUs', '1 of its 4 GPUs', '1 of the 4 GPUs')
    """
    if gpus == 1:
        return f"{whose} GPU"
    if needed is not None and 0 < needed < gpus:
        return f"{needed} of {whose} {gpus} GPUs"
    return f"{whose} {gpus} GPUs"


def preempted_reason(
    victim_tenant: str, gpus: int, by_tenant: str | None, needed: int | None = None
) -> str:
    """`preempted: nlp took back its GPU` (`1 of its 4 GPUs`, `its 4 GPUs`: `gpus_taken`,
    `needed` the preemptor's size), or a higher priority of the same team."""
    taken = gpus_taken(gpus, needed)
    if by_tenant is None:
        return f"preempted: another request needed {taken}"
    if by_tenant != victim_tenant:
        return f"preempted: {by_tenant} took back {taken}"
    return f"preempted: a higher-priority request of {by_tenant} needed {taken}"


def culled_reason(idle_timeout: float) -> str:
    """`culled: idle on its GPU for 30 min`."""
    return (
        f"culled: idle on its GPU for {format_duration(idle_timeout)}"
        if idle_timeout
        else "culled: idle"
    )


def expired_reason(reservation_ttl: float) -> str:
    """`expired: its parked GPU was not taken back within 15 min`."""
    within = f" within {format_duration(reservation_ttl)}" if reservation_ttl else ""
    return f"expired: its parked GPU was not taken back{within}"


def _by(reason: str, verb: str, viewer: str | None) -> str | None:
    """`you`, `alice` or `an admin (root)` from `cancelled by …`, None for another verb."""
    head = f"{verb} by "
    if not reason.startswith(head):
        return None
    who = reason[len(head) :]
    return "you" if viewer is not None and who == viewer else who


def ended_words(req: Mapping[str, Any], viewer: str | None = None) -> str:
    """What happened to an ended request, in a few words for a history row:
    `succeeded`, `cancelled by you`, `cancelled by an admin (root)`, `preempted: nlp took
    back its GPU`, `culled: idle on its GPU for 30 min`. `viewer`: who reads it."""
    state = str(req.get("state") or "")
    reason = str(req.get("reason") or "")
    who = _by(reason, "cancelled", viewer) or _by(reason, "released", viewer)
    if who is not None:
        verb = "cancelled" if state == "cancelled" or reason.startswith("cancelled") else "stopped"
        return f"{verb} by {who}"
    if reason.startswith(("preempted:", "culled:", "expired:")):
        return reason
    if reason == "lease expired":
        return "lost: it stopped answering the gateway"
    if reason.startswith("reservation claimed by"):
        return "resumed by a new request"
    if state == "rejected":
        return f"refused: {reason}" if reason else "refused"
    if state == "preempted":
        return "preempted"
    if state == "culled":
        return "culled: idle"
    if state == "finished":
        return reason or ("succeeded" if req.get("kind") == "job" else "finished")
    return reason or state or "ended"


def ending_sentence(req: Mapping[str, Any], viewer: str | None = None) -> str:
    """The one sentence that ends a request's page, row or status line: who or what ended
    it and why, for `viewer` (its owner unless said otherwise).

    >>> ending_sentence({"state": "cancelled", "reason": "cancelled by an admin (root)"})
    'An admin (root) cancelled your GPU request.'
    >>> ending_sentence({"state": "preempted", "kind": "kernel",
    ...                  "reason": "preempted: nlp took back its GPU"})
    'Your kernel was stopped: nlp took back its GPU.'
    """
    if viewer is None:
        viewer = str(req.get("user") or "") or None
    kind = str(req.get("kind") or "server")
    state = str(req.get("state") or "")
    reason = str(req.get("reason") or "")
    yours = f"your {kind}"
    for verb in ("cancelled", "released"):
        who = _by(reason, verb, viewer)
        if who is None:
            continue
        subject = "You" if who == "you" else who[0].upper() + who[1:]
        if verb == "cancelled":
            return f"{subject} cancelled {'your' if who != 'you' else 'the'} GPU request."
        return f"{subject} stopped {yours} and released its GPU."
    words = ended_words(req, viewer)
    if reason.startswith("preempted:"):
        return f"{yours.capitalize()} was stopped: {words.split(': ', 1)[1]}."
    if reason.startswith("culled:"):
        return f"{yours.capitalize()} was stopped: it was {words.split(': ', 1)[1]}."
    if state == "parked":
        return (
            f"{yours.capitalize()} was stopped: it was idle on its GPU, which stays reserved "
            "for a while for your next start."
        )
    if reason.startswith("expired:"):
        return f"{yours.capitalize()} lost its parked GPU: it was not taken back in time."
    if reason == "lease expired":
        return (
            f"{yours.capitalize()} lost its GPU: it stopped renewing its grant (it crashed, "
            "or could not reach the gateway)."
        )
    if reason.startswith("reservation claimed by"):
        return f"{yours.capitalize()}'s parked GPU went to your new request."
    if state == "rejected":
        return f"Your GPU request was refused: {reason or 'it can never be admitted'}."
    if state == "preempted":
        return f"{yours.capitalize()} was stopped to make room for another request."
    if state == "culled":
        return f"{yours.capitalize()} was stopped: it was idle on its GPU."
    if state == "cancelled":
        return "The GPU request was cancelled."
    return f"{yours.capitalize()} ended: {words}."


#: A notebook's GPU kernel that asks for its GPU only when a cell runs (server/kernels.py's
#: `deferred` state): the sidebar's row, the status bar and the kernel model say this.
DEFERRED_KERNEL = "GPU kernel: takes a GPU when you run a cell"
