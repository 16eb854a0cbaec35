"""Input rules of the gateway: what may reach the core and the store.

One place for the bounds every route and the store share, so a value that passes the edge
can always be written (no integer the columns cannot hold, no string the database's UTF-8
cannot encode) and a value the store would refuse never reaches the core.

Names. Tenants, cohorts and flavors follow one rule: a DNS-1123 subdomain (lowercase
letters, digits, `-` and `.`, starting and ending with a letter or digit) of at most 63
characters. That is what Kueue accepts for ClusterQueue, cohort and ResourceFlavor names,
and at 63 characters it is also a valid Kubernetes label value and a harmless Prometheus
label. The dot is allowed because MIG flavors are named like `a100-mig-1g.10gb`.

Integers are JSON Schema's (2.0 is 2; 2.5 is refused) and 32-bit signed (`priority` in
±2^31-1, the range of a Kubernetes PriorityClass value and of a PostgreSQL `integer`
column). Free text (`name`) is valid
UTF-8 (no lone surrogates), has no control characters, and is at most 255 characters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

INT32_MAX = 2**31 - 1
PRIORITY_MIN, PRIORITY_MAX = -INT32_MAX, INT32_MAX
NAME_MAX = 63
TEXT_MAX = 255
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME_RULE = (
    "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, "
    f"at most {NAME_MAX} characters"
)
# An admin's tenant values (PUT api/tenants/{name}): each has a ceiling, so a typo of
# 1e308 is refused at the edge instead of overflowing a deadline or a sum later. A GPU
# count past a million is no cluster; a duration past 30 days (1 day for a preemption
# grace, after which a preemption would never happen in practice) no policy.
COUNT_MAX = 1_000_000
WEIGHT_MAX = 1_000_000.0
DAY = 86_400
TENANT_SECONDS_MAX = {
    "idle_timeout": 30 * DAY,
    "reservation_ttl": 30 * DAY,
    "preemption_grace": DAY,
}
TENANT_COUNTS = ("quota", "borrowing_limit", "lending_limit")
# Query strings of GET api/requests: `limit`, free filters and the page cursor.
LIMIT_DEFAULT, LIMIT_MAX = 1000, 10000
QUERY_MAX = 255
# A page cursor is the (created, id) of the last row of the previous page, in the order of
# the list: `<created>_<id>`. Any such pair is a valid place to resume from, so the
# document can state the whole format (and a fuzzer's cursors are answered 200).
CURSOR_RE = re.compile(r"([0-9]{1,12}(\.[0-9]{1,17})?)_(r-[0-9a-f]{16})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ASCII_DIGITS = re.compile(r"[0-9]{1,9}")
# json.loads would parse 4,300-digit integers and NaN; neither is ever meaningful here.
_MAX_NUMBER_CHARS = 40


class InputError(ValueError):
    """Bad input: one sentence, and the field it is about (HTTP 400)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def is_name(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= NAME_MAX and bool(NAME_RE.fullmatch(value))


def check_name(value: Any, field: str) -> str:
    """A tenant, cohort or flavor name (the one rule of this module's docstring)."""
    if not isinstance(value, str) or not value:
        raise InputError(f"{field} must be a non-empty string", field)
    if not is_name(value):
        shown = value if len(value) <= 40 and value.isprintable() else "this value"
        raise InputError(f"{field} {shown!r} is not a valid name: {NAME_RULE}", field)
    return value


def check_text(value: Any, field: str, *, limit: int = TEXT_MAX) -> str:
    """Free text a person wrote: valid UTF-8, no control characters, bounded length."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{field} must be a non-empty string", field)
    if len(value) > limit:
        raise InputError(f"{field} must be at most {limit} characters", field)
    check_unicode(value, field)
    if _CONTROL.search(value):
        raise InputError(f"{field} must not contain control characters", field)
    return value


def check_unicode(value: str, field: str | None) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{field or 'a string'} is not valid UTF-8 (it holds a lone surrogate)", field
        ) from None


def check_int(value: Any, field: str, *, minimum: int, maximum: int) -> int:
    # 2.0 is an integer to JSON Schema (and so to the OpenAPI document): take it as 2.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{field} must be an integer", field)
    # The side that was crossed, in the words a person typing -1 or 9999999999 expects.
    if value < minimum:
        raise InputError(f"{field} must be at least {minimum}", field)
    if value > maximum:
        raise InputError(f"{field} must be at most {maximum}", field)
    return value


def _over(value: Any, ceiling: float) -> bool:
    """A number above `ceiling` (non-numbers are the quota format's to refuse)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and bool(value > ceiling)


def check_tenant_bounds(spec: Mapping[str, Any]) -> None:
    """The ceilings of a tenant spec's numbers (the OpenAPI document's `maximum`s).

    Only the ceilings: types, floors and the rules across fields are the quota format's
    (admission/config.py), which names the key in its own sentence."""
    for key, ceiling in TENANT_SECONDS_MAX.items():
        value = spec.get(key)
        if _over(value, ceiling):
            raise InputError(f"{key} must be at most {ceiling} seconds ({ceiling // DAY} "
                             f"{'day' if ceiling == DAY else 'days'})", key)  # fmt: skip
    weight = spec.get("weight")
    if _over(weight, WEIGHT_MAX):
        raise InputError(f"weight must be at most {WEIGHT_MAX:g}", "weight")
    for key in TENANT_COUNTS:
        block = spec.get(key)
        if not isinstance(block, Mapping):
            continue
        for flavor, value in block.items():
            if _over(value, COUNT_MAX):
                field = f"{key}.{flavor}"
                raise InputError(f"{field} must be at most {COUNT_MAX:,} GPUs", field)


def parse_limit(raw: str, *, maximum: int) -> int:
    """A `limit` query value: ASCII digits only (int() also reads '²' and '١')."""
    if not _ASCII_DIGITS.fullmatch(raw) or not 1 <= int(raw) <= maximum:
        raise InputError(f"limit must be an integer from 1 to {maximum}", "limit")
    return int(raw)


def format_cursor(created: float, rid: str) -> str:
    # repr() of a float reads back as the same float: no row is skipped or repeated.
    text = repr(float(created))
    return f"{text}_{rid}" if "e" not in text else f"{created:.9f}_{rid}"


def parse_cursor(raw: str) -> tuple[float, str]:
    match = CURSOR_RE.fullmatch(raw)
    if match is None:
        raise InputError("cursor is not one this gateway gave (follow the Link header)", "cursor")
    return float(match.group(1)), match.group(3)


def _number(text: str) -> int | float:
    if len(text) > _MAX_NUMBER_CHARS:
        raise InputError(f"a number in the body is longer than {_MAX_NUMBER_CHARS} characters")
    return float(text) if any(c in text for c in ".eE") else int(text)


def _constant(text: str) -> Any:
    raise InputError(f"{text} is not a number JSON allows")


def json_media_type(header: str | None) -> str | None:
    """None when a Content-Type header says JSON as the API takes it, else why not.

    Taken: `application/json`, with at most a `charset=utf-8` parameter (any case, the
    charset quoted or not): what our clients, the sidebar's proxy and the Hub spawner
    send. Anything else (a form, text/plain, a missing header, another charset) is
    refused rather than guessed at: a browser can send a cross-site form or text/plain
    body without asking first, but not `application/json`.
    """
    if header is None or not header.strip():
        return "the request has a body but no Content-Type: send Content-Type: application/json"
    media, *params = (part.strip() for part in header.split(";"))
    if media.lower() != "application/json":
        return f"Content-Type {header[:60]!r} is not JSON: send Content-Type: application/json"
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() != "charset" or value.strip().strip('"').lower() != "utf-8":
            return (
                f"Content-Type parameter {param[:40]!r} is not taken: JSON bodies are "
                "UTF-8 (application/json or application/json; charset=utf-8)"
            )
    return None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: `{"gpus": 1, "gpus": 8}` is refused
    rather than read as whichever came last (RFC 8259 leaves it to the reader; a proxy or
    a validator in front of us may have read the first)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 40 and key.isprintable() else key[:40] + "…"
                raise InputError(
                    f"the key {shown!r} appears more than once in the body: send it once", key
                )
            seen.add(key)
    return out


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or InputError: bounded in depth, numbers and Unicode,
    each key of an object at most once."""
    if not body:
        raise InputError("a JSON object body is required")
    try:
        data = json.loads(
            body,
            parse_int=_number,
            parse_float=_number,
            parse_constant=_constant,
            object_pairs_hook=_object,
        )
    except RecursionError:
        raise InputError("body is nested too deeply") from None
    except UnicodeDecodeError:
        raise InputError("body is not valid UTF-8") from None
    except InputError as e:
        if e.field is not None:
            check_unicode(e.field, None)  # a duplicated lone surrogate: no such field
        raise
    except ValueError as e:
        raise InputError(f"body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputError("body must be a JSON object")
    _check_strings(data, None, 0)
    return data


def _check_strings(value: Any, field: str | None, depth: int) -> None:
    """Every key and string of a parsed body is encodable (no lone surrogate)."""
    if depth > 32:
        raise InputError("body is nested too deeply")
    if isinstance(value, str):
        check_unicode(value, field)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            check_unicode(k, k)
            _check_strings(v, field or k, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_strings(v, field, depth + 1)
