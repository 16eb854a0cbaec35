"""Read and validate scenario files (SCENARIO.md): quota config, requests, expectations.

Format errors are `ScenarioError`s naming the offending key (`requests[3].gpus`), so the
CLI can print one line and exit 2. A request naming an unknown tenant or flavor is *not* a
format error: the core rejects it at submit time, as the gateway would.

Requests come inline (`requests:`) or from a CSV trace (`requests_file:`), which may hold
100,000 rows; the CSV path converts cells with plain `int`/`float` and only parses `busy`
as JSON when the cell is not empty.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from jupyter_gpuaas.admission.config import (
    SpecError,
    parse_config,
    want_mapping,
    want_number,
)
from jupyter_gpuaas.admission.model import KINDS, Config
from jupyter_gpuaas.sim.schema_check import check_schema

__all__ = [
    "REQUEST_KEYS",
    "SCENARIO_KEYS",
    "Scenario",
    "ScenarioError",
    "ScenarioRequest",
    "load_scenario",
    "parse_scenario",
]

SCENARIO_KEYS = (
    "flavors",
    "cohorts",
    "tenants",
    "policy",
    "until",
    "requests",
    "requests_file",
    "expect",
)
REQUEST_KEYS = (
    "id",
    "tenant",
    "user",
    "kind",
    "gpus",
    "flavor",
    "priority",
    "submit",
    "duration",
    "busy",
    "cancel",
)
REQUIRED_REQUEST_KEYS = ("id", "tenant", "user", "kind", "gpus", "submit", "duration")
_REQUEST_KEY_SET = frozenset(REQUEST_KEYS)
_KIND_SET = frozenset(KINDS)

Interval = tuple[float, float]
# ScenarioRequest's fields in the order of its __init__, for its repr.
_FIELD_NAMES = (*REQUIRED_REQUEST_KEYS, "flavor", "priority", "busy", "cancel")


# A scenario file that cannot be read or breaks the format. The same class as the quota
# format's errors, not a subclass: the admission package is compiled with mypyc, whose
# classes plain Python cannot subclass.
ScenarioError = SpecError


class ScenarioRequest:
    """One request of a scenario, as written (times in seconds from the clock's start).

    `busy` is relative to the request's first admission; None means busy all the time.

    A plain class with its own `__init__`, not a dataclass: compiled with mypyc, a
    dataclass's generated `__init__` runs as interpreted code, which a month's 100,000
    requests paid ~0.2 s for; this one is built natively. It keeps what the frozen
    dataclass gave: positional or keyword construction, read-only fields (Final: mypy
    refuses an assignment, the compiled class raises AttributeError), ==, hash and repr.
    """

    def __init__(
        self,
        id: str,
        tenant: str,
        user: str,
        kind: str,
        gpus: int,
        submit: float,
        duration: float,
        flavor: str | None = None,
        priority: int = 0,
        busy: tuple[Interval, ...] | None = None,
        cancel: float | None = None,
    ) -> None:
        self.id: Final = id
        self.tenant: Final = tenant
        self.user: Final = user
        self.kind: Final = kind
        self.gpus: Final = gpus
        self.submit: Final = submit
        self.duration: Final = duration
        self.flavor: Final = flavor
        self.priority: Final = priority
        self.busy: Final = busy
        self.cancel: Final = cancel

    def _fields(self) -> tuple[Any, ...]:
        # By name: == and hash are for tests and sets, never on a hot path.
        return tuple(getattr(self, name) for name in _FIELD_NAMES)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScenarioRequest):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in zip(_FIELD_NAMES, self._fields(), strict=True))
        return f"ScenarioRequest({shown})"


@dataclass(frozen=True)
class Scenario:
    config: Config
    requests: tuple[ScenarioRequest, ...]
    until: float | None = None
    expect: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""


def _fail(key: str, problem: str) -> ScenarioError:
    return ScenarioError(key, problem)


# --- loading -------------------------------------------------------------------------


_YAML_BASE: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _construct_mapping(self: Any, node: Any, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            key = key_node.value
            if key in seen:
                mark = key_node.start_mark
                raise ScenarioError("", f"duplicate key {key!r} at line {mark.line + 1}")
            seen.add(key)
    return _YAML_BASE.construct_mapping(self, node, deep=deep)


def _yaml_loader() -> type[Any]:
    """The fastest safe loader, refusing duplicate keys (YAML silently keeps the last).

    Made with type(), not a class statement: this module is compiled with mypyc, whose
    classes cannot derive from PyYAML's."""
    # partialmethod binds `self` whether or not the function is compiled (a compiled
    # function is not a descriptor, so it would not become a method by itself).
    method = functools.partialmethod(_construct_mapping)
    return type("StrictLoader", (_YAML_BASE,), {"construct_mapping": method})


_LOADER = _yaml_loader()


def _parse_text(text: str, where: str) -> Any:
    """JSON when the text is JSON, else YAML; errors say the line."""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass  # maybe YAML flow style; let YAML say what is wrong
    try:
        return yaml.load(text, Loader=_LOADER)
    # One name per handler: compiled (mypyc), a name keeps the type of its first binding.
    except ScenarioError as duplicate:
        raise ScenarioError(where, duplicate.problem) from None
    except yaml.MarkedYAMLError as marked:
        mark = marked.problem_mark or marked.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = marked.problem or marked.context or "syntax error"
        raise ScenarioError(where, f"invalid YAML{at}: {problem}") from None
    except yaml.YAMLError as other:
        raise ScenarioError(where, f"invalid YAML: {other}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` of `simulate --set`: a dotted key and a value read as a YAML scalar."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ScenarioError(
            "--set", f"{text!r} is not KEY=VALUE (a dotted key, e.g. policy.idle_timeout=1200)"
        )
    try:
        value = yaml.load(raw, Loader=_LOADER) if raw.strip() else None
    except yaml.YAMLError:
        raise ScenarioError(key, f"{raw!r} is not a YAML value") from None
    if isinstance(value, (dict, list)):
        raise ScenarioError(key, f"{raw!r} must be a single value, not a {type(value).__name__}")
    return key, value


def apply_overrides(data: Any, overrides: Iterable[tuple[str, Any]]) -> Any:
    """The document with each dotted `key` set to its value (missing mappings made), so
    the result is validated exactly like a file that said so."""
    for key, value in overrides:
        parts = key.split(".")
        if not isinstance(data, dict):
            raise ScenarioError("", "a scenario must be a mapping to take --set")
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ScenarioError(key, f"cannot set inside {where}, which is not a mapping")
            node = child
        node[parts[-1]] = value
    return data


def load_scenario(path: str | Path, overrides: Iterable[tuple[str, Any]] = ()) -> Scenario:
    """Read a YAML or JSON scenario file, with `overrides` (dotted key, value) applied
    before validation; every problem is a `ScenarioError`."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ScenarioError(where, f"cannot read: {reason}") from None
    data = apply_overrides(_parse_text(text, where), overrides)
    try:
        return parse_scenario(data, base_dir=path.parent, name=path.stem)
    except SpecError as bad:
        if not bad.key:
            raise ScenarioError(where, bad.problem) from None
        raise


# --- parsing -------------------------------------------------------------------------


def parse_scenario(data: Any, *, base_dir: Path | None = None, name: str = "") -> Scenario:
    """Validate a scenario document (already parsed from YAML/JSON) into a `Scenario`.

    `base_dir` resolves a relative `requests_file` (default: the current directory).
    """
    if not isinstance(data, Mapping):
        kind = "an empty document" if data is None else type(data).__name__
        raise _fail(
            "", f"a scenario must be a mapping with flavors, tenants and requests, not {kind}"
        )
    top = want_mapping(data, "")
    for key in top:
        if key not in SCENARIO_KEYS:
            raise _fail(key, f"unknown key (allowed: {', '.join(SCENARIO_KEYS)})")
    config = parse_config(
        {k: top[k] for k in ("flavors", "cohorts", "tenants", "policy") if k in top}
    )

    until_raw = top.get("until")
    until = None if until_raw is None else want_number(until_raw, "until")

    expect_raw = top.get("expect")
    expect = {} if expect_raw is None else dict(want_mapping(expect_raw, "expect"))

    has_list = "requests" in top
    has_file = "requests_file" in top
    if has_list == has_file:
        raise _fail("requests", "give exactly one of requests or requests_file")
    if has_list:
        raw = top["requests"]
        if raw is None:
            raw = []
        if not isinstance(raw, list):
            raise _fail("requests", f"must be a list, not {type(raw).__name__}")
        requests = _parse_list(raw)
    else:
        rel = top["requests_file"]
        if not isinstance(rel, str) or not rel:
            raise _fail("requests_file", "must be a path to a CSV file")
        requests = _read_csv(rel, base_dir)
    # The published schema (docs: scenario.schema.json) holds too, once every rule above
    # has had its say in its own words. The requests themselves (a list or a CSV's rows)
    # were checked one by one above, by the same rules as the schema's (the shipped
    # scenarios are held to both by tests/test_docs_reference.py); a schema pass over them
    # would cost 0.2 ms a request, 3 s of the Kueue baseline's 15,000.
    check_schema({**top, "requests": []} if has_list else top)
    return Scenario(config=config, requests=requests, until=until, expect=expect, name=name)


def _parse_list(raw: list[Any]) -> tuple[ScenarioRequest, ...]:
    seen: dict[str, int] = {}
    out = []
    for i, item in enumerate(raw):
        key = f"requests[{i}]"
        out.append(_parse_request(want_mapping(item, key), key, seen, i))
    return tuple(out)


def _read_csv(rel: str, base_dir: Path | None) -> tuple[ScenarioRequest, ...]:
    path = Path(rel)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            return _parse_csv(fh, rel)
    except OSError as unreadable:
        reason = unreadable.strerror or unreadable
        raise _fail("requests_file", f"cannot read {rel!r}: {reason}") from None
    except UnicodeDecodeError as undecodable:
        raise _fail("requests_file", f"cannot read {rel!r}: {undecodable}") from None
    except csv.Error as malformed:
        raise _fail(rel, f"invalid CSV: {malformed}") from None


def _parse_csv(lines: Iterable[str], where: str) -> tuple[ScenarioRequest, ...]:
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        raise _fail(where, "empty file: the first row must name the columns")
    header = [h.strip() for h in header]
    for col in header:
        if col not in _REQUEST_KEY_SET:
            raise _fail(f"{where}:1.{col}", f"unknown column (allowed: {', '.join(REQUEST_KEYS)})")
    if len(set(header)) != len(header):
        raise _fail(f"{where}:1", "a column is named twice")
    for col in REQUIRED_REQUEST_KEYS:
        if col not in header:
            raise _fail(f"{where}:1.{col}", "required column is missing")
    width = len(header)
    columns = _Columns(header)
    seen: dict[str, int] = {}
    out: list[ScenarioRequest] = []
    for index, row in enumerate(reader):
        if len(row) == width:
            fast = columns.request(row, seen, index)
            if fast is not None:
                out.append(fast)
                continue
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line
        key = f"{where}:{reader.line_num}"
        if len(row) > width:
            raise _fail(key, f"{len(row)} cells but the header names {width} columns")
        item: dict[str, Any] = {}
        for col, cell in zip(header, row, strict=False):
            cell = cell.strip()
            if cell:
                item[col] = _convert_cell(col, cell, key)
        out.append(_parse_request(item, key, seen, index))
    return tuple(out)


class _Columns:
    """A CSV row read straight into a `ScenarioRequest`, column by known column.

    The common row, complete and valid, costs no dict and no per-cell dispatch (a
    month's 100,000 rows spent ~0.4 s there). Anything unusual (a cell that does not
    convert, a value out of range, a duplicate id) gives None, and the row goes the
    general way, `_convert_cell` and `_parse_request`, which say what is wrong: this
    path only ever accepts what that one accepts, and builds the same request.
    """

    def __init__(self, header: list[str]) -> None:
        at = {name: i for i, name in enumerate(header)}
        # The required columns are known to be there (checked before).
        self.id = at["id"]
        self.tenant = at["tenant"]
        self.user = at["user"]
        self.kind = at["kind"]
        self.gpus = at["gpus"]
        self.submit = at["submit"]
        self.duration = at["duration"]
        # -1: no such column, the field keeps its default.
        self.flavor = at.get("flavor", -1)
        self.priority = at.get("priority", -1)
        self.busy = at.get("busy", -1)
        self.cancel = at.get("cancel", -1)

    def request(self, row: list[str], seen: dict[str, int], index: int) -> ScenarioRequest | None:
        """The request of a row with one cell per column, or None to take the general way."""
        rid = row[self.id].strip()
        tenant = row[self.tenant].strip()
        user = row[self.user].strip()
        kind = row[self.kind].strip()
        if not rid or not tenant or not user or kind not in _KIND_SET or rid in seen:
            return None
        try:
            gpus = int(row[self.gpus].strip())
            submit = float(row[self.submit].strip())
            duration = float(row[self.duration].strip())
        except ValueError:
            return None
        # Written as ranges so that NaN fails them too.
        if gpus < 1 or not (0.0 <= submit < math.inf) or not (0.0 <= duration < math.inf):
            return None
        flavor: str | None = None
        if self.flavor >= 0:
            flavor = row[self.flavor].strip() or None
        priority = 0
        cancel: float | None = None
        busy: tuple[Interval, ...] | None = None
        try:
            if self.priority >= 0:
                cell = row[self.priority].strip()
                if cell:
                    priority = int(cell)
            if self.cancel >= 0:
                cell = row[self.cancel].strip()
                if cell:
                    cancel = float(cell)
                    if not (submit <= cancel < math.inf):
                        return None
            if self.busy >= 0:
                cell = row[self.busy].strip()
                if cell:
                    busy = _plain_busy(cell)
                    if busy is None:
                        # The key is only for an error, and an error goes the general way.
                        busy = _parse_busy(json.loads(cell), "")
        except (ValueError, ScenarioError):
            return None
        seen[rid] = index
        return ScenarioRequest(
            rid, tenant, user, kind, gpus, submit, duration, flavor, priority, busy, cancel
        )


def _plain_busy(cell: str) -> tuple[Interval, ...] | None:
    """The intervals of a busy cell written the plain way, `[[0,600],[1200,1800]]`, or
    None for anything else (spaces, fractions, a problem), which json.loads and
    `_parse_busy` then read. The same intervals as that way, for a fraction of its cost
    (json.loads runs three interpreted frames per call, and a month has 80,000 cells)."""
    if not cell.startswith("[[") or not cell.endswith("]]") or not cell.isascii():
        return None
    out: list[Interval] = []
    prev = 0.0
    for pair in cell[2:-2].split("],["):
        a, comma, b = pair.partition(",")
        # Each a JSON integer (no sign, no leading zero) of at most 15 digits: exact as a
        # float, so comparing floats says what comparing JSON's ints says. (Checked
        # inline, the cell's ASCII once: a function per number was 1.2 M calls a month.)
        if (
            not comma
            or not a.isdigit()
            or not b.isdigit()
            or len(a) > 15
            or len(b) > 15
            or (a[0] == "0" and len(a) > 1)
            or (b[0] == "0" and len(b) > 1)
        ):
            return None
        start = float(a)
        end = float(b)
        if not (prev <= start < end):
            return None
        out.append((start, end))
        prev = end
    return tuple(out)


def _convert_cell(col: str, cell: str, key: str) -> Any:
    """Turn a CSV cell into what YAML would have given; leave bad cells for validation."""
    try:
        if col in ("gpus", "priority"):
            return int(cell)
        if col in ("submit", "duration", "cancel"):
            return float(cell)
    except ValueError:
        return cell
    if col == "busy":
        try:
            return json.loads(cell)
        except ValueError:
            raise _fail(f"{key}.busy", "must be JSON like [[0, 600]] or empty") from None
    return cell


_PLAIN_NUMBERS = (int, float)


def _number(value: Any, key: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise _fail(key, "must be a non-negative number")
    return float(value)


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(key, "must be a non-empty string")
    return value


def _parse_request(
    item: Mapping[str, Any], key: str, seen: dict[str, int], index: int
) -> ScenarioRequest:
    for k in item:
        if k not in _REQUEST_KEY_SET:
            raise _fail(f"{key}.{k}", f"unknown key (allowed: {', '.join(REQUEST_KEYS)})")
    for k in REQUIRED_REQUEST_KEYS:
        if item.get(k) is None:
            raise _fail(f"{key}.{k}", "is required")

    rid = item["id"]
    if isinstance(rid, int) and not isinstance(rid, bool):
        rid = str(rid)
    rid = _string(rid, f"{key}.id")
    if rid in seen:
        raise _fail(f"{key}.id", f"duplicate id {rid!r}")
    seen[rid] = index

    kind = item["kind"]
    if not isinstance(kind, str) or kind not in _KIND_SET:
        raise _fail(f"{key}.kind", f"must be one of {', '.join(KINDS)} (got {kind!r})")
    gpus = item["gpus"]
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise _fail(f"{key}.gpus", "must be a positive integer")
    priority = item.get("priority")
    if priority is None:
        priority = 0
    elif isinstance(priority, bool) or not isinstance(priority, int):
        raise _fail(f"{key}.priority", "must be an integer")
    submit = _number(item["submit"], f"{key}.submit")
    duration = _number(item["duration"], f"{key}.duration")

    flavor = item.get("flavor")
    if flavor is not None:
        flavor = _string(flavor, f"{key}.flavor")
    cancel = item.get("cancel")
    if cancel is not None:
        cancel = _number(cancel, f"{key}.cancel")
        if cancel < submit:
            raise _fail(f"{key}.cancel", f"{cancel:g} is before submit {submit:g}")
    busy_raw = item.get("busy")
    busy = None if busy_raw is None else _parse_busy(busy_raw, f"{key}.busy")

    return ScenarioRequest(
        id=rid,
        tenant=_string(item["tenant"], f"{key}.tenant"),
        user=_string(item["user"], f"{key}.user"),
        kind=kind,
        gpus=gpus,
        submit=submit,
        duration=duration,
        flavor=flavor,
        priority=priority,
        busy=busy,
        cancel=cancel,
    )


def _parse_busy(value: Any, key: str) -> tuple[Interval, ...]:
    if not isinstance(value, list):
        raise _fail(key, "must be a list of [start, end] intervals")
    out: list[Interval] = []
    prev_end = 0.0
    for i, pair in enumerate(value):
        # Fast path for the common, valid pair (a month of trace has millions of them);
        # anything else goes through the checks that name what is wrong.
        if type(pair) is list and len(pair) == 2:
            start, end = pair
            if (
                type(start) in _PLAIN_NUMBERS
                and type(end) in _PLAIN_NUMBERS
                and prev_end <= start < end < math.inf
            ):
                out.append((float(start), float(end)))
                prev_end = end
                continue
        pkey = f"{key}[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise _fail(pkey, "must be a [start, end] pair")
        start = _number(pair[0], pkey)
        end = _number(pair[1], pkey)
        if end <= start:
            raise _fail(pkey, f"interval runs backwards or is empty ({start:g} >= {end:g})")
        raise _fail(pkey, f"intervals must be sorted without overlap ({start:g} < {prev_end:g})")
    return tuple(out)
