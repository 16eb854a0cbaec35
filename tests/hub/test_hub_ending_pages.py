"""A culled, preempted or expired server's ending, read in Chromium on the spawn form
(issue 45, item 4).

carol's GPU server (tenant nlp, culled after 10 idle seconds by the session hub's quota
file) is culled by the gateway and stopped through the Hub. When she logs in again, the
spawn form she lands on says, in one sentence, what ended her last server and why: no HTTP
code, no request id, no clause twice, and no "Spawning server" after the end. (JupyterHub
drops a stopped server's Spawner and makes a new one for the form: the sentence travels in
the state it saves at the stop; this test found it lost there.) (An admin's
cancel of a pending spawn is read on its page by test_hub_landing.py; the sidebar's
endings by the Galata suite.)

A preemption and an expiry need another quota file than the session hub's: a module hub
of its own (`endings_hub`) puts vision and nlp in one cohort (vision reclaims what nlp
borrowed, with no grace) and parks a culled nlp server's GPU for 5 s only. After that
expiry the form says the reservation is gone, not that it "stays reserved" (it said so
before: the sentence chosen at the cull was kept as it was).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from helpers import browser_page
from hubutil import Hub

# Four a100s. bob (vision) may borrow nlp's idle one; carol (nlp) takes it back at once.
# nlp servers are culled after 10 idle seconds and their GPU parked for 5 s.
ENDINGS_QUOTAS = """\
flavors:
  a100: {nodes: 1, gpus_per_node: 4}
tenants:
  vision: {cohort: demo, quota: {a100: 3}}
  nlp:
    cohort: demo
    quota: {a100: 1}
    preemption: {reclaim_within_cohort: Any}
    idle_timeout: 10
    reservation_ttl: 5
policy: {idle_timeout: 0, reservation_ttl: 0, preemption_grace: 0}
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def endings_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with Hub(tmp_path_factory.mktemp("endings-hub"), quotas=ENDINGS_QUOTAS).running() as hub:
        yield hub


@pytest.fixture
def page() -> Iterator[Any]:
    with browser_page(1280, 900) as page:
        yield page


def spawn_form_ending(hub: Hub, page: Any, user: str, rid: str) -> str:
    """`user` logs in, lands on the spawn form and reads its ending sentence, which the
    page says without an HTTP code, a request id, a clause twice or a spawn after it."""
    hub.log_in(page, user)
    page.wait_for_url("**/hub/spawn**")
    said: str = page.locator("#gpuaas-ended").inner_text().strip()
    body = page.inner_text("body")
    assert rid not in body and not re.search(r"\br-[0-9a-f]{8,}", body), body
    assert not re.search(r"HTTP\s*\d{3}|\b[45]\d\d\b", body), body
    assert "Spawning server" not in body, body
    clauses = [c.strip() for c in re.split(r"[.;:\n]", said) if len(c.strip()) > 8]
    assert len(clauses) == len(set(clauses)), said
    return said


def test_a_culled_servers_next_spawn_form_says_what_ended_it(clean_hub: Hub, page: Any) -> None:
    hub = clean_hub
    assert hub.spawn("carol", {"tenant": "nlp", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("carol")
    (rid,) = [r["id"] for r in hub.requests_of("carol") if r["state"] == "admitted"]
    # nlp culls after 10 idle seconds; the spawner reports idle after 1 s without activity.
    hub.wait_stopped("carol", timeout=30)
    try:
        said = spawn_form_ending(hub, page, "carol", rid)
        # Culled, its quota parked (nlp keeps it 120 s): what happened, and what it means.
        assert said == (
            "Your server was stopped: it was idle on its GPU, which stays reserved for a "
            "while for your next start."
        ), said
    finally:
        # Its quota stays parked for two minutes: given back, for the session's next tests.
        requests.delete(
            f"{hub.gateway}/requests/{rid}",
            headers={"Authorization": f"token {hub.hub_token}"},
            timeout=10,
        )


def test_a_preempted_servers_next_spawn_form_says_who_took_its_gpu(
    endings_hub: Hub, page: Any
) -> None:
    hub = endings_hub
    hub.cleanup()
    # bob's 4 a100s: vision's 3 and nlp's idle one, borrowed.
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 4}).status_code in (201, 202)
    hub.wait_ready("bob")
    (rid,) = [r["id"] for r in hub.requests_of("bob") if r["state"] == "admitted"]
    try:
        # carol wants nlp's GPU back: bob's server is preempted (no grace) and stopped.
        assert hub.spawn("carol", {"tenant": "nlp", "gpus": 1}).status_code in (201, 202)
        hub.wait_stopped("bob", timeout=60)
        (ended,) = [r for r in hub.requests_of("bob") if r["id"] == rid]
        assert ended["state"] == "preempted", ended
        said = spawn_form_ending(hub, page, "bob", rid)
        # Counted: carol's team wanted one of bob's four GPUs back (issue 45).
        assert said == "Your server was stopped: nlp took back 1 of its 4 GPUs.", said
    finally:
        hub.cleanup()


def test_an_expired_reservations_next_spawn_form_says_it_expired(
    endings_hub: Hub, page: Any
) -> None:
    hub = endings_hub
    hub.cleanup()
    assert hub.spawn("carol", {"tenant": "nlp", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("carol")
    (rid,) = [r["id"] for r in hub.requests_of("carol") if r["state"] == "admitted"]
    hub.wait_stopped("carol", timeout=30)  # culled after 10 idle seconds, its GPU parked

    def expired() -> bool:
        (req,) = [r for r in hub.requests_of("carol") if r["id"] == rid]
        return str(req.get("reason") or "").startswith("expired:")

    hub.wait_for(expired, 30, "carol's parked GPU to expire")
    said = spawn_form_ending(hub, page, "carol", rid)
    # The reservation is gone: the form no longer says it waits for her next start.
    assert said == "Your server lost its parked GPU: it was not taken back in time.", said
    assert "reserved" not in said, said
