"""The one formatter of the words people read (jupyter_gpuaas/words.py), case by case."""

from __future__ import annotations

import pytest

from jupyter_gpuaas.words import (
    Release,
    about,
    about_field,
    format_duration,
    join_names,
    plural,
    usage_phrase_of,
    usage_sentence,
    usage_sentence_of,
    wait_sentence,
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "unknown"),
        (-5, "0 s"),
        (0, "0 s"),
        (0.4, "0 s"),
        (1, "1 s"),
        (59.4, "59 s"),
        (59.6, "1 min"),  # rounds up into the next unit, never "60 s"
        (61, "1 min"),
        (89, "1 min"),
        (91, "2 min"),
        (238, "4 min"),  # the wait that read "3m 58s" in one place
        (3569, "59 min"),
        (3599, "1 h"),  # never "60 min"
        (3600, "1 h"),
        (5400, "1 h 30 min"),
        (7322, "2 h 2 min"),
        (86399, "1 d"),
        (90000, "1 d 1 h"),
        (3 * 86400, "3 d"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "less than a minute"), (59, "less than a minute"), (60, "about 1 min"),
     (720, "about 12 min"), (4000, "about 1 h 7 min")],
)  # fmt: skip
def test_about(seconds: float, text: str) -> None:
    assert about(seconds) == text


@pytest.mark.parametrize(
    ("count", "noun", "many", "text"),
    [(0, "request", None, "0 requests"), (1, "request", None, "1 request"),
     (2, "GPU", None, "2 GPUs"), (2, "a100", "a100", "2 a100"),
     (1, "more GPU", None, "1 more GPU")],
)  # fmt: skip
def test_plural(count: int, noun: str, many: str | None, text: str) -> None:
    assert plural(count, noun, many) == text


@pytest.mark.parametrize(
    ("names", "text"),
    [([], ""), (["nlp"], "nlp"), (["nlp", "ops"], "nlp and ops"), (["a", "b", "c"], "a, b and c")],
)
def test_join_names(names: list[str], text: str) -> None:
    assert join_names(names) == text


@pytest.mark.parametrize(
    ("used", "quota", "lenders", "parked", "text"),
    [
        (4, 2, ["nlp"], 0, "vision uses 4 a100: 2 of its own and 2 borrowed from nlp"),
        (
            5,
            2,
            ["nlp", "ops"],
            0,
            "vision uses 5 a100: 2 of its own and 3 borrowed from nlp and ops",
        ),
        (2, 0, ["nlp"], 0, "vision uses 2 a100, all borrowed from nlp"),
        (3, 2, [], 0, "vision uses 3 a100: 2 of its own and 1 borrowed from its cohort"),
        (0, 2, [], 0, "vision uses none of its 2 a100"),
        (0, 0, [], 0, "vision has no a100 quota"),
        (1, 2, [], 0, "vision uses 1 of its 2 a100"),
        (2, 2, [], 0, "vision uses all 2 of its a100"),
        (1, 1, [], 0, "vision uses its only a100"),
        (
            2,
            4,
            [],
            1,
            "vision uses 2 of its 4 a100 (1 of them parked for a culled kernel or server)",
        ),
    ],
)
def test_usage_sentence(used: int, quota: int, lenders: list[str], parked: int, text: str) -> None:
    assert usage_sentence("vision", "a100", used=used, quota=quota, lenders=lenders,
                          parked=parked) == text  # fmt: skip
    assert " of 2 a100" not in text  # never "4 of 2"


def test_usage_from_the_gateways_json() -> None:
    entry = {"flavor": "a100", "quota": 2, "admitted": 3, "parked": 1, "borrowed": 2,
             "borrowed_from": ["nlp"]}  # fmt: skip
    assert usage_sentence_of("vision", entry) == (
        "vision uses 4 a100: 2 of its own and 2 borrowed from nlp "
        "(1 of them parked for a culled kernel or server)"
    )
    assert usage_phrase_of({"flavor": "t4", "quota": 8, "admitted": 0}) == "uses none of its 8 t4"


@pytest.mark.parametrize(
    ("field", "problem", "text"),
    [
        ("gpus", "must be 0 or more", "gpus must be 0 or more"),
        ("gpus", "must be at least 1", "gpus must be at least 1"),
        (
            "busy",
            "is required and must be true or false",
            "busy is required and must be true or false",
        ),
        ("tenant", "you are not a member of tenant 'nlp'", "you are not a member of tenant 'nlp'"),
        ("gpus", "2 GPUs do not fit on one node", "2 GPUs do not fit on one node"),
        (None, "no request r1", "no request r1"),
        ("gpus", "", "gpus is not valid"),
    ],
)
def test_about_field(field: str | None, problem: str, text: str) -> None:
    assert about_field(field, problem) == text
    assert f"({field})" not in text


def test_wait_sentences() -> None:
    alice = Release("alice", "job", 720)
    assert wait_sentence(flavor="a100", total=4, free=0, gpus=1, release=alice) == (
        "waiting: all 4 a100 are in use; the next one frees when alice's job ends (about 12 min)"
    )
    assert wait_sentence(flavor="a100", total=4, free=0, gpus=1) == (
        "waiting: all 4 a100 are in use; no estimate yet"
    )
    idle = Release("bob", "server", 30, idle=True)
    assert wait_sentence(flavor="a100", total=1, free=0, gpus=1, release=idle) == (
        "waiting: the only a100 is in use; the next one frees when bob's idle server is culled "
        "(less than a minute)"
    )
    assert wait_sentence(flavor="a100", total=4, free=1, gpus=2, ahead=1, release=alice,
                         turn=1800) == (
        "waiting: 1 of 4 a100 is free and it needs 2, 1 request ahead; the next one frees when "
        "alice's job ends (about 12 min); its turn in about 30 min"
    )  # fmt: skip
    assert wait_sentence(flavor="a100", total=4, free=2, gpus=1, ahead=2) == (
        "waiting: 2 requests ahead in the queue; no estimate yet"
    )
    quota = "nlp uses all 2 of its a100"
    assert wait_sentence(flavor="a100", total=4, free=2, gpus=1, quota=quota) == (
        "waiting for quota: nlp uses all 2 of its a100; no estimate yet"
    )
    kernel = Release("carol", "kernel", 300)
    assert "when carol's kernel stops (about 5 min)" in wait_sentence(
        flavor="a100", total=4, free=0, gpus=1, release=kernel
    )
    # Another user's grant, to one who may not see names: the tenant, never the user.
    theirs = Release(None, "kernel", 300, tenant="vision")
    assert wait_sentence(flavor="a100", total=4, free=0, gpus=1, release=theirs) == (
        "waiting: all 4 a100 are in use; the next one frees when a kernel of another user of "
        "vision stops (about 5 min)"
    )
    idle = Release(None, "server", 30, idle=True, tenant="nlp")
    assert idle.phrase() == (
        "when an idle server of another user of nlp is culled (less than a minute)"
    )


def test_lent_out_is_said_with_its_number() -> None:
    from jupyter_gpuaas.words import eta_phrase, reason_sentence

    details = {"tenant": "nlp", "flavor": "a100", "gpus": 1, "used": 0, "nominal": 2,
               "cohort": "research"}  # fmt: skip
    assert reason_sentence("quota", {**details, "lent_out": 1}).endswith(
        "and 1 of them is lent out in the cohort"
    )
    assert reason_sentence("quota", {**details, "lent_out": 2}).endswith(
        "and 2 of them are lent out in the cohort"
    )
    # The forward run's estimate: a range, a known time, none; never "less than a minute".
    assert eta_phrase(1500, 900, 2400) == "likely in about 25 min (15 min to 40 min)"
    assert eta_phrase(1740, 1740, 1740) == "in about 29 min"
    assert eta_phrase(30, 10, 200) == "likely within a minute (10 s to 3 min)"
    assert eta_phrase(3000, 2000, None) == "likely in about 50 min (33 min or more)"
    assert eta_phrase(None, None, None) == "no estimate yet"
