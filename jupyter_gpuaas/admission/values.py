"""The checks every value of a configuration or scenario goes through, and the error
they raise: one line naming the dotted key (`tenants.vision.quota.a100: must be a
non-negative integer`). Shared by config.py (the quota blocks) and the simulator's
scenario parser. Pure: stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = [
    "SpecError",
    "check_keys",
    "fail",
    "join_key",
    "optional",
    "want_bool",
    "want_choice",
    "want_int",
    "want_mapping",
    "want_name",
    "want_number",
]


class SpecError(ValueError):
    """A configuration or scenario that breaks the format.

    `key` is the dotted path of the offending value (empty for the document itself) and
    `problem` says what is wrong; `str()` is the one line the CLI prints.
    """

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(key, problem)
        self.key = key
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}" if self.key else self.problem


def join_key(prefix: str, key: str) -> str:
    """`prefix.key`, or `key` alone when there is no prefix (or `prefix` alone)."""
    if not prefix:
        return key
    if not key:
        return prefix
    return f"{prefix}.{key}"


def fail(key: str, problem: str) -> NoReturn:
    raise SpecError(key, problem)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def want_mapping(value: Any, key: str) -> Mapping[str, Any]:
    """A mapping with string keys (YAML can produce int or null keys; those are errors)."""
    if not isinstance(value, Mapping):
        fail(key, f"must be a mapping, not {_type_name(value)}")
    for k in value:
        if not isinstance(k, str) or not k:
            fail(join_key(key, str(k)), "keys must be non-empty strings")
    return value


def check_keys(value: Mapping[str, Any], allowed: tuple[str, ...], key: str) -> None:
    for k in value:
        if k not in allowed:
            fail(join_key(key, k), f"unknown key (allowed: {', '.join(allowed)})")


def want_int(value: Any, key: str, *, minimum: int = 0) -> int:
    """An integer (not a bool, not a float) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        if minimum == 0:
            fail(key, "must be a non-negative integer")
        if minimum == 1:
            fail(key, "must be a positive integer")
        fail(key, f"must be an integer >= {minimum}")
    return value


def want_number(value: Any, key: str, *, positive: bool = False) -> float:
    """A finite non-negative number (> 0 when `positive`); bools are not numbers."""
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    if not ok:
        fail(key, "must be a positive number" if positive else "must be a non-negative number")
    return float(value)


def want_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        fail(key, "must be true or false")
    return value


def want_name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        fail(key, "must be a non-empty string")
    return value


def want_choice(value: Any, choices: tuple[str, ...], key: str) -> str:
    if not isinstance(value, str) or value not in choices:
        fail(key, f"must be one of {', '.join(choices)} (got {value!r})")
    # The choice's own object (a literal, interned): the core compares policies with
    # literals millions of times, and identity is the fast path of a string compare.
    return choices[choices.index(value)]


def optional(block: Mapping[str, Any], name: str) -> Any:
    """The value of an optional key; an explicit null counts as absent (YAML `key:`)."""
    return block.get(name)
