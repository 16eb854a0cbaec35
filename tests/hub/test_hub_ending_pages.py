"""A culled server's ending, read in Chromium on the spawn form (issue 45, item 4).

carol's GPU server (tenant nlp, culled after 10 idle seconds by the session hub's quota
file) is culled by the gateway and stopped through the Hub. When she logs in again, the
spawn form she lands on says, in one sentence, what ended her last server and why: no HTTP
code, no request id, no clause twice, and no "Spawning server" after the end. (JupyterHub
drops a stopped server's Spawner and makes a new one for the form: the sentence travels in
the state it saves at the stop; this test found it lost there.) (An admin's
cancel of a pending spawn is read on its page by test_hub_landing.py; the sidebar's
endings by the Galata suite.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from helpers import browser_page
from hubutil import Hub

pytestmark = pytest.mark.slow


@pytest.fixture
def page() -> Iterator[Any]:
    with browser_page(1280, 900) as page:
        yield page


def test_a_culled_servers_next_spawn_form_says_what_ended_it(clean_hub: Hub, page: Any) -> None:
    hub = clean_hub
    assert hub.spawn("carol", {"tenant": "nlp", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("carol")
    (rid,) = [r["id"] for r in hub.requests_of("carol") if r["state"] == "admitted"]
    # nlp culls after 10 idle seconds; the spawner reports idle after 1 s without activity.
    hub.wait_stopped("carol", timeout=30)
    try:
        hub.log_in(page, "carol")
        page.wait_for_url("**/hub/spawn**")
        said = page.locator("#gpuaas-ended").inner_text().strip()
        # Culled, its quota parked (nlp keeps it 120 s): what happened, and what it means.
        assert said == (
            "Your server was stopped: it was idle on its GPU, which stays reserved for a "
            "while for your next start."
        ), said
        body = page.inner_text("body")
        assert rid not in body and not re.search(r"\br-[0-9a-f]{8,}", body), body
        assert not re.search(r"HTTP\s*\d{3}|\b[45]\d\d\b", body), body
        assert "Spawning server" not in body, body
        clauses = [c.strip() for c in re.split(r"[.;:\n]", said) if len(c.strip()) > 8]
        assert len(clauses) == len(set(clauses)), said
    finally:
        # Its quota stays parked for two minutes: given back, for the session's next tests.
        requests.delete(
            f"{hub.gateway}/requests/{rid}",
            headers={"Authorization": f"token {hub.hub_token}"},
            timeout=10,
        )
