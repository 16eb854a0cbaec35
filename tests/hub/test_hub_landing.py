"""The gateway's landing page, /services/gpuaas/, in Chromium through a real JupyterHub.

Users log in to the Hub with their password and open the page; the Hub's OAuth (HubOAuth)
signs them in to the gateway. alice, who may see only her own requests, sees hers and
counts of the others, no Cancel button but on her own, and no quota form. The Hub's admin
sees every request, cancels one of alice's with its button, and changes vision's quota in
the form (a bad value shows the API's own sentence). A forged POST, without the page's
XSRF token, is refused. A restart of the gateway keeps the cookie secret: the browser's
login survives it. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import os
import re
import signal
import stat
from typing import Any

import pytest
import requests
from helpers import new_page
from hubutil import REPO, Hub, log_in

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"
SCRIPT_NAME = "<script>document.title='pwned'</script>"


def open_landing(browser: Any, hub: Hub, user: str, password: str) -> Any:
    """A fresh browser that logs in to the Hub as `user` and lands on the GPU page."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = new_page(browser, 1280, 1000, 30_000)
    log_in(page, hub.url, user, password, "%2Fservices%2Fgpuaas%2F")
    page.wait_for_url(re.compile(r".*/services/gpuaas/(\?.*)?$"))
    page.locator("#whoami").wait_for()
    assert page.inner_text("#whoami") == user
    return page


def xsrf_of(page: Any) -> str:
    value = page.get_attribute("input[name=_xsrf]", "value")
    assert value, "the page's forms carry no _xsrf token"
    return str(value)


def row(page: Any, rid: str) -> Any:
    return page.locator(f'tr[data-request="{rid}"]')


def gateway_pid(hub: Hub) -> int:
    pid = hub.gateway_pid()
    if pid is None:
        raise AssertionError(f"no gateway process under the hub\n{hub.log()}")
    return pid


def submit_as(hub: Hub, user: str, body: dict[str, Any]) -> dict[str, Any]:
    """Submit with the user's own server token (what a notebook on the server would do)."""
    token = hub.environ(user)["JUPYTERHUB_API_TOKEN"]
    resp = requests.post(
        f"{hub.gateway}/requests",
        json=body,
        headers={"Authorization": f"token {token}"},
        timeout=10,
    )
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


def test_landing_page_for_a_user_and_for_the_admin(clean_hub: Hub, browser: Any) -> None:
    hub = clean_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")
    (server,) = [r for r in hub.requests_of("alice") if r["state"] == "admitted"]
    # vision's 3 a100 are all alice's: bob's spawn and alice's job wait behind them.
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 1}).status_code == 202
    hub.wait_for(
        lambda: [r for r in hub.requests_of("bob") if r["state"] == "queued"], 30, "bob to queue"
    )
    job = submit_as(
        hub, "alice", {"tenant": "vision", "kind": "job", "gpus": 1, "name": SCRIPT_NAME}
    )
    assert job["state"] == "queued"
    try:
        # --- alice: her requests, counts of the others, no admin controls -----------
        page = open_landing(browser, hub, "alice", hub.password)
        queue = page.inner_text("#queue")
        assert "2 of 2; 2 of 2 in vision" in row(page, job["id"]).inner_text()
        assert "Also waiting, from other users: 1 in vision" in queue
        assert "bob" not in page.inner_text("main")
        # The request name is shown as text: no script ran, none was added.
        assert SCRIPT_NAME in row(page, job["id"]).inner_text()
        assert page.title() != "pwned" and page.locator("script").count() == 0
        holding = row(page, server["id"]).inner_text()
        assert "alice" in holding and "server" in holding
        usage = page.locator('table.usage[data-tenant="vision"] tr[data-flavor="a100"]')
        assert usage.locator("td.quota").inner_text() == "3"
        assert usage.locator("td.used").inner_text() == "3"
        assert page.locator("#devices td.holder", has_text="alice (vision, server").count() == 3
        buttons = page.locator("form[action$='/cancel'] input[name=request]")
        mine = {server["id"], job["id"]}
        assert set(buttons.evaluate_all("xs => xs.map(x => x.value)")) == mine
        assert page.locator("form.tenant-form").count() == 0
        page.screenshot(path=str(ARTIFACTS / "landing-alice.png"), full_page=True)

        # --- the admin: every request, Cancel on each, the quota form ---------------
        admin = open_landing(browser, hub, "admin", hub.admin_password)
        (bob_req,) = [r for r in hub.requests_of("bob") if r["state"] == "queued"]
        for rid in (server["id"], job["id"], bob_req["id"]):
            assert row(admin, rid).locator("button.cancel").count() == 1
        assert "bob" in row(admin, bob_req["id"]).inner_text()

        # A forged POST (the admin's cookies, no XSRF token) is refused; nothing changes.
        forged = admin.request.post(
            f"{hub.url}/services/gpuaas/cancel", form={"request": job["id"]}, max_redirects=0
        )
        assert forged.status == 403, forged.text()
        assert "XSRF" in forged.text()
        forged = admin.request.delete(f"{hub.url}/services/gpuaas/api/requests/{job['id']}")
        assert forged.status == 403
        assert {r["id"]: r["state"] for r in hub.requests_of("alice")}[job["id"]] == "queued"

        # Cancel alice's job with its button: asked first, then it is gone from the page
        # and the queue.
        row(admin, job["id"]).locator("button.cancel").click()
        question = admin.locator("#confirm-question")
        question.wait_for()
        assert question.inner_text() == (
            "Cancel the request of alice's job (1 GPU)? It leaves the queue. "
            "alice is told an admin (admin) did it."
        )
        assert {r["id"]: r["state"] for r in hub.requests_of("alice")}[job["id"]] == "queued"
        admin.locator("#confirm button.confirm").click()
        admin.wait_for_url(re.compile(r".*/services/gpuaas/\?cancelled=.*"))
        assert f"Request {job['id']} (alice, vision) is cancelled." in admin.inner_text("#notice")
        assert row(admin, job["id"]).count() == 0
        assert {r["id"]: r["state"] for r in hub.requests_of("alice")}[job["id"]] == "cancelled"
        admin.screenshot(path=str(ARTIFACTS / "landing-admin-cancelled.png"), full_page=True)

        # A bad quota: the API's sentence, inline, and nothing changed.
        form = admin.locator("#tenant-form-vision")
        form.locator("input[name='quota.a100']").fill("-1")
        form.locator("button[type=submit]").click()
        error = admin.locator("#tenant-error-vision")
        error.wait_for()
        api = admin.request.put(
            f"{hub.url}/services/gpuaas/api/tenants/vision",
            data='{"quota": {"a100": -1}}',
            headers={"X-XSRFToken": xsrf_of(admin), "Content-Type": "application/json"},
        )
        assert api.status == 400
        # In words; the API's scenario key only as a hint.
        assert error.inner_text() == (
            "Not saved:\nQuota for a100: must be a whole number of GPUs, 0 or more, not '-1' "
            "(tenants.vision.quota.a100)"
        )
        assert "must be" in api.json()["error"] and "a100" in api.json()["error"]
        bad = admin.locator("#tenant-form-vision input[name='quota.a100']")
        assert bad.get_attribute("aria-invalid") == "true" and bad.input_value() == "-1"
        assert hub.tenant("vision")["quota"] == {"a100": 3}
        admin.screenshot(path=str(ARTIFACTS / "landing-admin-quota-error.png"), full_page=True)

        # A good one: saved, shown, and bob's spawn is admitted on the 4th a100.
        form = admin.locator("#tenant-form-vision")
        form.locator("input[name='quota.a100']").fill("4")
        form.locator("button[type=submit]").click()
        admin.wait_for_url(re.compile(r".*/services/gpuaas/\?saved=vision.*"))
        assert "Saved the quota and limits of vision." in admin.inner_text("#notice")
        usage = admin.locator('table.usage[data-tenant="vision"] tr[data-flavor="a100"]')
        assert usage.locator("td.quota").inner_text() == "4"
        assert hub.tenant("vision")["quota"] == {"a100": 4}
        hub.wait_ready("bob", timeout=60)
        admin.reload()
        assert "bob (vision, server" in admin.inner_text("#devices")
        admin.screenshot(path=str(ARTIFACTS / "landing-admin.png"), full_page=True)
    finally:
        restore_vision_quota(hub, browser)


def test_an_admins_cancel_ends_the_users_spawn_page_in_words(clean_hub: Hub, browser: Any) -> None:
    """Issue 45 item 4: bob's pending spawn, cancelled by the admin from the GPU page (who
    is asked first), ends bob's page with one sentence saying who did it: no HTTP code,
    no request id, and nothing logged after it."""
    hub = clean_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("alice")

    context = browser.new_context(viewport={"width": 1200, "height": 900})
    bob = context.new_page()
    bob.set_default_timeout(30_000)
    hub.log_in(bob, "bob")
    bob.wait_for_url("**/hub/spawn**")
    bob.fill("#gpuaas-gpus", "1")
    bob.click("#spawn_form button[type=submit]")
    bob.wait_for_url("**/spawn-pending/bob**")
    bob.locator("#progress-message").filter(has_text="position 1 of 1").wait_for()
    (queued,) = [r for r in hub.requests_of("bob") if r["state"] == "queued"]

    admin = open_landing(browser, hub, "admin", hub.admin_password)
    row(admin, queued["id"]).locator("button.cancel").click()
    admin.locator("#confirm-question").wait_for()
    assert "Cancel the request of bob's server (1 GPU)?" in admin.inner_text("#confirm")
    admin.locator("#confirm button.confirm").click()
    admin.wait_for_url(re.compile(r".*/services/gpuaas/\?cancelled=.*"))

    sentence = "An admin (admin) cancelled your GPU request."
    message = bob.locator("#progress-message")
    message.filter(has_text=sentence).wait_for(timeout=60_000)
    assert message.inner_text().strip() == sentence
    bob.locator("#progress-details").evaluate("d => d.open = true")
    log = [e.strip() for e in bob.locator(".progress-log-event").all_inner_texts()]
    assert log[-1] == sentence and log.count(sentence) == 1, log
    page_text = bob.inner_text("body")
    for jargon in ("HTTP", "409", queued["id"], "Spawning server", "GPU request failed"):
        assert jargon not in page_text, (jargon, page_text)
    bob.screenshot(path=str(ARTIFACTS / "spawn-pending-admin-cancel.png"), full_page=True)
    hub.wait_stopped("bob")
    # Bob goes back to the spawn form, as a person would: it offers a new start (and the
    # Hub replaces the failed spawner there, not in the next test's API start, where
    # JupyterHub would answer 201 for a start still pending).
    bob.goto(f"{hub.url}/hub/spawn")
    bob.locator("#gpuaas-gpus").wait_for()
    context.close()


def restore_vision_quota(hub: Hub, browser: Any) -> None:
    """Put vision back to the quota the other hub tests expect, through the form again
    (the tester's token has no admin scope)."""
    if hub.tenant("vision")["quota"] == {"a100": 3}:
        return
    admin = open_landing(browser, hub, "admin", hub.admin_password)
    form = admin.locator("#tenant-form-vision")
    form.locator("input[name='quota.a100']").fill("3")
    form.locator("button[type=submit]").click()
    admin.wait_for_url(re.compile(r".*\?saved=vision.*"))
    assert hub.tenant("vision")["quota"] == {"a100": 3}


def test_a_gateway_restart_keeps_the_login(clean_hub: Hub, browser: Any) -> None:
    hub = clean_hub
    secret_file = hub.root / "state" / "gpuaas_cookie_secret"
    page = open_landing(browser, hub, "alice", hub.password)
    assert secret_file.exists()
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text()
    landing = f"{hub.url}/services/gpuaas/"
    # Signed in: the page answers at once, no detour through the Hub's OAuth.
    assert page.request.get(landing, max_redirects=0).status == 200

    old = gateway_pid(hub)
    os.kill(old, signal.SIGTERM)
    # The Hub restarts its managed service (it polls it every 30 s).
    hub.wait_for(lambda: _gateway_up(hub, old), 120, "the Hub to restart the gateway")
    assert secret_file.read_text() == secret
    again = page.request.get(landing, max_redirects=0)
    assert again.status == 200, (again.status, again.headers)
    assert '<strong id="whoami">alice</strong>' in again.text()
    page.reload()
    assert page.url == landing and page.inner_text("#whoami") == "alice"
    page.screenshot(path=str(ARTIFACTS / "landing-after-gateway-restart.png"), full_page=True)


def _gateway_up(hub: Hub, old_pid: int) -> bool:
    try:
        if gateway_pid(hub) == old_pid:
            return False
    except AssertionError:
        return False
    try:
        return requests.get(f"{hub.gateway}/devices", headers=hub._gw, timeout=2).ok
    except requests.RequestException:
        return False
