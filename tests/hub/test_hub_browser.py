"""The spawn form and the spawn-pending page in a real browser (headless Chromium).

bob logs in with the shared password, sees the form (only his tenant, the simulated-device
banner), asks for one GPU while alice holds all of vision's quota, and the pending page
shows his place in the queue, updated by the Hub's progress stream. Screenshots are kept
under test-artifacts/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import new_page
from hubutil import REPO, Hub

pytestmark = pytest.mark.slow


@pytest.fixture
def page(browser: Any) -> Any:
    return new_page(browser, 1200, 900, 30_000)


def test_spawn_form_and_pending_page_show_the_queue(clean_hub: Hub, page) -> None:  # type: ignore[no-untyped-def]
    hub = clean_hub
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")

    hub.log_in(page, "bob")
    page.wait_for_url("**/hub/spawn**")
    page.wait_for_selector("#gpuaas-tenant")
    tenants = page.eval_on_selector_all("#gpuaas-tenant option", "os => os.map(o => o.value)")
    assert tenants == ["vision"]  # bob is not in nlp: it is not offered
    assert "SIMULATED" in page.inner_text("#gpuaas-banner")
    page.fill("#gpuaas-gpus", "1")
    page.screenshot(path=str(artifacts / "hub-spawn-form.png"), full_page=True)

    page.click("#spawn_form button[type=submit]")
    page.wait_for_url("**/spawn-pending/bob**")
    message = page.locator("#progress-message")
    message.filter(has_text="position 1 of 1").wait_for()
    text = message.inner_text()
    assert "Queued for 1× GPU (team vision)" in text
    assert "waiting for quota: vision uses all 3 of its a100" in text
    shot = artifacts / "hub-spawn-pending.png"
    page.screenshot(path=str(shot), full_page=True)
    assert Path(shot).stat().st_size > 0

    # Stopping alice admits bob; the same page follows to the running server.
    hub.stop_server("alice")
    page.wait_for_url("**/user/bob/**", timeout=60_000)
    hub.wait_ready("bob")


def test_spawn_form_shows_a_bad_gpus_value_as_the_apis_sentence(clean_hub: Hub, page) -> None:  # type: ignore[no-untyped-def]
    """The form and the Hub's REST API run one validation: the same sentence, naming the
    field, and no "HTTP 400: Bad Request (…)" around it."""
    hub = clean_hub
    api = hub.spawn("bob", {"tenant": "vision", "gpus": -1})
    assert api.status_code == 400, api.text
    assert api.json()["message"] == "gpus must be 0 or more"
    hub.wait_stopped("bob")

    hub.log_in(page, "bob")
    page.wait_for_url("**/hub/spawn**")
    page.fill("#gpuaas-gpus", "-1")
    page.click("#spawn_form button[type=submit]")
    error = page.locator(".spawn-error-msg")
    error.wait_for()
    text = error.inner_text().strip()
    # "Error: " is JupyterHub's own label of the form's message; the rest is the API's.
    assert text == "Error: gpus must be 0 or more", text
    assert "HTTP" not in page.inner_text("body")
    page.wait_for_selector("#gpuaas-gpus")  # the form again, to correct the value
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    page.screenshot(path=str(artifacts / "hub-spawn-form-error.png"), full_page=True)
    assert hub.server("bob") is None  # refused before any spawn began
