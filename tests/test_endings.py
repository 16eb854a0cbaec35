"""Every ending of a request in words (issue 45 item 4): the reasons the gateway stores and
the one sentence the spawn page, the sidebar and `%gpu status` show (words.py)."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpuaas.words import (
    culled_reason,
    ended_by,
    ended_words,
    ending_sentence,
    expired_reason,
    preempted_reason,
)


@pytest.mark.parametrize(
    ("req", "viewer", "words", "sentence"),
    [
        (
            {"state": "cancelled", "reason": "cancelled by an admin (root)", "user": "bob"},
            None,
            "cancelled by an admin (root)",
            "An admin (root) cancelled your GPU request.",
        ),
        (
            {"state": "cancelled", "reason": "cancelled by bob", "user": "bob"},
            "bob",
            "cancelled by you",
            "You cancelled the GPU request.",
        ),
        (
            {"state": "finished", "reason": "released by an admin (root)", "kind": "kernel"},
            "bob",
            "stopped by an admin (root)",
            "An admin (root) stopped your kernel and released its GPU.",
        ),
        (
            {"state": "preempted", "kind": "kernel", "reason": "preempted: nlp took back its GPU"},
            None,
            "preempted: nlp took back its GPU",
            "Your kernel was stopped: nlp took back its GPU.",
        ),
        (
            {"state": "culled", "kind": "server", "reason": "culled: idle on its GPU for 30 min"},
            None,
            "culled: idle on its GPU for 30 min",
            "Your server was stopped: it was idle on its GPU for 30 min.",
        ),
        (
            {"state": "culled", "kind": "kernel", "reason": expired_reason(900)},
            None,
            "expired: its parked GPU was not taken back within 15 min",
            "Your kernel lost its parked GPU: it was not taken back in time.",
        ),
        (
            {"state": "finished", "kind": "server", "reason": "reservation claimed by r-41eb"},
            None,
            "resumed by a new request",
            "Your server's parked GPU went to your new request.",
        ),
        ({"state": "finished", "kind": "job"}, None, "succeeded", "Your job ended: succeeded."),
    ],
)
def test_every_ending_in_words_without_ids_or_codes(
    req: dict[str, Any], viewer: str | None, words: str, sentence: str
) -> None:
    assert ended_words(req, viewer) == words
    assert ending_sentence(req, viewer) == sentence
    assert "r-" not in sentence and "HTTP" not in sentence


def test_the_gateway_stores_endings_in_words() -> None:
    assert ended_by("cancelled", "bob", "bob") == "cancelled by bob"
    assert ended_by("released", "root", "bob") == "released by an admin (root)"
    assert preempted_reason("vision", 1, "nlp") == "preempted: nlp took back its GPU"
    assert preempted_reason("vision", 2, "vision") == (
        "preempted: a higher-priority request of vision needed its 2 GPUs"
    )
    assert culled_reason(1800) == "culled: idle on its GPU for 30 min"


@pytest.mark.parametrize(
    ("gpus", "needed", "by", "reason"),
    [
        # One GPU: "its GPU", whatever the preemptor asked for.
        (1, 1, "nlp", "preempted: nlp took back its GPU"),
        (1, 3, "nlp", "preempted: nlp took back its GPU"),
        # A 4-GPU server, one of them wanted back: counted, not "its GPUs".
        (4, 1, "nlp", "preempted: nlp took back 1 of its 4 GPUs"),
        (4, 3, "nlp", "preempted: nlp took back 3 of its 4 GPUs"),
        # All of them wanted (or more), or the preemptor unknown: all of them, counted.
        (4, 4, "nlp", "preempted: nlp took back its 4 GPUs"),
        (4, 8, "nlp", "preempted: nlp took back its 4 GPUs"),
        (4, None, "nlp", "preempted: nlp took back its 4 GPUs"),
        (2, 1, "vision", "preempted: a higher-priority request of vision needed 1 of its 2 GPUs"),
        (2, None, None, "preempted: another request needed its 2 GPUs"),
        (1, None, None, "preempted: another request needed its GPU"),
    ],
)
def test_a_preemption_counts_the_gpus_it_took(
    gpus: int, needed: int | None, by: str | None, reason: str
) -> None:
    """Issue 45: a 4-GPU server preempted for one GPU read "nlp took back its GPUs"."""
    assert preempted_reason("vision", gpus, by, needed) == reason
    # The sentence of the spawn page, the sidebar and `%gpu status` says the same count.
    said = ending_sentence({"state": "preempted", "kind": "server", "reason": reason})
    assert said == f"Your server was stopped: {reason.split(': ', 1)[1]}."


def test_gpu_status_says_how_the_last_requests_ended() -> None:
    """`%gpu status`: the last ended requests, newest first, one sentence each, by name."""
    from jupyter_gpuaas.jobs.views import RECENTLY_ENDED, StatusView

    ended = [
        {"id": "r-1", "name": "server alice", "kind": "server", "state": "cancelled",
         "reason": "cancelled by an admin (root)", "updated": 30.0},
        {"id": "r-2", "name": "GPU 1 (f7df35bd)", "kind": "kernel", "state": "preempted",
         "reason": "preempted: nlp took back its GPU", "updated": 20.0},
        {"id": "r-3", "name": None, "kind": "kernel", "state": "culled",
         "reason": "culled: idle on its GPU for 30 min", "updated": 40.0},
        {"id": "r-4", "name": "old", "kind": "job", "state": "finished", "updated": 1.0},
    ]  # fmt: skip
    status = {"me": {"name": "alice", "tenants": ["vision"]}, "requests": ended}
    lines = StatusView.from_status(status).lines
    at = lines.index("recently ended:")
    assert lines[at + 1 : at + 1 + RECENTLY_ENDED] == [
        "  kernel: Your kernel was stopped: it was idle on its GPU for 30 min.",
        "  server alice: An admin (root) cancelled your GPU request.",
        "  GPU 1: Your kernel was stopped: nlp took back its GPU.",
    ]
    assert "your live requests: 0" in lines
    assert not any("r-" in line for line in lines[at:])


def test_the_spawn_form_says_how_the_last_server_ended() -> None:
    from jupyter_gpuaas.hub.options import render_form

    sentence = ending_sentence(
        {"state": "preempted", "kind": "server", "reason": "preempted: nlp took back its GPU"}
    )
    page = render_form(tenants=[], flavor_names={}, default_gpus=0, max_gpus=4, ended=sentence)
    assert (
        '<div class="alert alert-info" id="gpuaas-ended">'
        "Your server was stopped: nlp took back its GPU.</div>"
    ) in page
    assert 'id="gpuaas-ended"' not in render_form(
        tenants=[], flavor_names={}, default_gpus=0, max_gpus=4
    )
