"""The landing page (pages.py) over real HTTP, standalone: a token in the header stands
in for the Hub login (the browser walk with HubOAuth and XSRF is tests/hub/
test_hub_landing.py). Users: alice and carol in vision (carol may view the queue), bob in
nlp, root the admin.
"""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlencode

import pytest
from gwutil import TOKENS, Gateway
from tornado.httpclient import AsyncHTTPClient

pytestmark = pytest.mark.asyncio


def rows(page: str) -> list[str]:
    """Request ids with a row on the page."""
    return re.findall(r'<tr data-request="([^"]+)"', page)


def cancel_buttons(page: str) -> list[str]:
    return re.findall(r'name="request" value="([^"]+)"', page)


def text(page: str) -> str:
    """What a reader sees: tags gone, entities decoded, white space collapsed."""
    page = re.sub(r"<style>.*?</style>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


async def fill(gw: Gateway) -> dict[str, Any]:
    """alice holds 4 a100 (all of them), then alice, bob and carol queue behind her."""
    held = await gw.client("alice").submit("vision", "job", 4, name="training")
    assert held["state"] == "admitted"
    return {
        "held": held,
        "alice": await gw.client("alice").submit("vision", "kernel", 2, name="<b>mine</b>"),
        "bob": await gw.client("bob").submit("nlp", "job", 1, name="bob's secret"),
        "carol": await gw.client("carol").submit("vision", "job", 1),
    }


async def post_form(gw: Gateway, path: str, fields: dict[str, str], who: str) -> tuple[int, str]:
    """A form POST as a browser sends it (the token stands in for the login cookie);
    the redirect that answers success is not followed."""
    resp = await AsyncHTTPClient().fetch(
        gw.url + path,
        method="POST",
        body=urlencode(fields),
        headers={"Authorization": f"token {TOKENS[who]}"},
        follow_redirects=False,
        raise_error=False,
    )
    if resp.code == 303:
        assert resp.headers["Location"].startswith("/?"), resp.headers["Location"]
    return resp.code, resp.body.decode()


async def test_a_user_sees_her_requests_and_counts_of_the_others(gw: Gateway) -> None:
    r = await fill(gw)
    status, page = await gw.raw("GET", "", who="alice")
    assert status == 200, page
    assert set(rows(page)) == {r["held"]["id"], r["alice"]["id"]}
    # Her own name is shown, escaped; bob's and carol's requests only as counts.
    assert "&lt;b&gt;mine&lt;/b&gt;" in page and "<b>mine</b>" not in page
    words = text(page)
    assert "bob" not in words and "bob's secret" not in words and "carol" not in words
    assert "Also waiting, from other users: 1 in nlp, 1 in vision (2 requests" in words
    # Her place in line and its wait, in words; the team's usage in words.
    assert "1 of 3; 1 of 2 in vision" in words
    assert "no estimate yet" in words or "expected in" in words
    assert "vision uses all 4 of its a100; 2 requests wait for 3 GPUs." in words
    # Cancel only on her own requests; no admin form.
    assert set(cancel_buttons(page)) == {r["held"]["id"], r["alice"]["id"]}
    assert 'class="tenant-form"' not in page
    # The devices say who holds them: alice herself.
    assert words.count("alice (vision, job") == 4


async def test_a_viewer_sees_names_but_cancels_only_her_own(gw: Gateway) -> None:
    r = await fill(gw)
    status, page = await gw.raw("GET", "", who="carol")
    assert status == 200
    assert set(rows(page)) == {r["held"]["id"], r["alice"]["id"], r["bob"]["id"], r["carol"]["id"]}
    assert "bob&#x27;s secret" in page or "bob&#39;s secret" in page
    assert cancel_buttons(page) == [r["carol"]["id"]]
    assert 'class="tenant-form"' not in page


async def test_the_admin_cancels_from_the_page(gw: Gateway) -> None:
    r = await fill(gw)
    status, page = await gw.raw("GET", "", who="root")
    assert status == 200
    assert set(cancel_buttons(page)) == {r[k]["id"] for k in ("held", "alice", "bob", "carol")}
    # The button asks first, in words, and does nothing until answered.
    status, page = await post_form(gw, "cancel", {"request": r["alice"]["id"]}, "root")
    assert status == 200 and gw.arbiter.view(r["alice"]["id"])["state"] == "queued"
    assert (
        "Cancel the request of alice's kernel (2 GPUs)? It leaves the queue. "
        "alice is told an admin (root) did it. Yes, cancel No, keep it"
    ) in text(page)
    assert re.search(r'name="confirm" value="yes"', page)
    status, _ = await post_form(
        gw, "cancel", {"request": r["alice"]["id"], "confirm": "yes"}, "root"
    )
    assert status == 303
    obj = gw.arbiter.view(r["alice"]["id"])
    assert obj["state"] == "cancelled" and obj["reason"] == "cancelled by an admin (root)"
    # Releasing a grant asks too.
    status, page = await post_form(gw, "cancel", {"request": r["held"]["id"]}, "root")
    assert (
        status == 200
        and "Release the GPUs of alice's job (4 a100)? It is stopped at once." in text(page)
    )
    assert gw.arbiter.view(r["held"]["id"])["state"] == "admitted"
    status, page = await gw.raw("GET", f"?cancelled={r['alice']['id']}", who="root")
    assert f"Request {r['alice']['id']} (alice, vision) is cancelled." in text(page)
    assert r["alice"]["id"] not in rows(page)
    # A second cancel: the API's 409 sentence, on the page (nothing left to ask about).
    status, page = await post_form(gw, "cancel", {"request": r["alice"]["id"]}, "root")
    api_status, api = await gw.raw("DELETE", f"api/requests/{r['alice']['id']}", who="root")
    assert status == api_status == 409
    assert api["error"] in text(page)


async def test_a_user_cannot_cancel_another_users_request(gw: Gateway) -> None:
    r = await fill(gw)
    status, page = await post_form(gw, "cancel", {"request": r["bob"]["id"]}, "alice")
    api_status, api = await gw.raw("DELETE", f"api/requests/{r['bob']['id']}", who="alice")
    assert status == api_status == 403
    assert api["error"] in text(page)
    assert gw.arbiter.view(r["bob"]["id"])["state"] == "queued"


async def test_the_admin_changes_a_quota_through_the_form(gw: Gateway) -> None:
    status, page = await gw.raw("GET", "", who="root")
    assert 'id="tenant-form-vision"' in page and 'id="tenant-form-nlp"' in page
    form = {"tenant": "vision", "quota.a100": "3", "quota.t4": "2", "lending_limit.a100": "1"}
    status, _ = await post_form(gw, "tenant", form, "root")
    assert status == 303
    vision = next(t for t in gw.arbiter.tenants_json()["tenants"] if t["name"] == "vision")
    assert vision["quota"] == {"a100": 3, "t4": 2}
    assert vision["lending_limit"] == {"a100": 1}
    assert vision["cohort"] == "research"  # what the form does not show is kept
    status, page = await gw.raw("GET", "?saved=vision", who="root")
    assert "Saved the quota and limits of vision." in text(page)
    assert 'name="quota.a100" id="vision-quota.a100" value="3"' in page


@pytest.mark.parametrize(
    ("field", "value", "body"),
    [
        ("quota.a100", "-1", {"quota": {"a100": -1}}),
        ("quota.a100", "two", {"quota": {"a100": "two"}}),
        ("quota.a100", "1.5", {"quota": {"a100": 1.5}}),
        ("lending_limit.a100", "9", {"quota": {"a100": 4}, "lending_limit": {"a100": 9}}),
    ],
)
async def test_a_bad_quota_shows_the_apis_sentence(
    gw: Gateway, field: str, value: str, body: dict[str, Any]
) -> None:
    form = {"tenant": "vision", "quota.a100": "4", field: value}
    status, page = await post_form(gw, "tenant", form, "root")
    api_status, api = await gw.raw("PUT", "api/tenants/vision", body, who="root")
    assert status == api_status == 400, (page, api)
    # In words, with the scenario key only as a hint after it.
    label = "Quota" if field.startswith("quota") else "Lending limit"
    key = f"tenants.vision.{field}"
    said = re.search(r"Not saved: (.*?) \(" + re.escape(key) + r"\)", text(page))
    assert said is not None, text(page)
    assert said.group(1).startswith(f"{label} for a100: ") and key not in said.group(1)
    # What was typed stays in the form, marked, and nothing changed.
    assert f'name="{field}" id="vision-{field}" value="{html.escape(value)}"' in page
    assert 'aria-invalid="true"' in page
    vision = next(t for t in gw.arbiter.tenants_json()["tenants"] if t["name"] == "vision")
    assert vision["quota"] == {"a100": 4, "t4": 0}


async def test_every_bad_field_of_the_quota_form_is_said_at_once(gw: Gateway) -> None:
    form = {"tenant": "vision", "quota.a100": "two", "quota.t4": "-1", "lending_limit.a100": "1.5"}
    status, page = await post_form(gw, "tenant", form, "root")
    assert status == 400
    words = text(page)
    assert "Quota for a100: must be a whole number of GPUs, 0 or more, not 'two'" in words
    assert "Quota for t4: must be a whole number of GPUs, 0 or more, not '-1'" in words
    assert "Lending limit for a100: must be a whole number of GPUs, 0 or more, not '1.5'" in words
    assert page.count('aria-invalid="true"') == 3
    vision = next(t for t in gw.arbiter.tenants_json()["tenants"] if t["name"] == "vision")
    assert vision["quota"] == {"a100": 4, "t4": 0}


async def test_only_admins_change_quotas(gw: Gateway) -> None:
    status, page = await post_form(gw, "tenant", {"tenant": "vision", "quota.a100": "9"}, "carol")
    api_status, api = await gw.raw("PUT", "api/tenants/vision", {"quota": {"a100": 9}}, "carol")
    assert status == api_status == 403
    assert api["error"] in text(page)


async def test_no_login_no_page(gw: Gateway) -> None:
    status, page = await gw.raw("GET", "", who=None)
    assert status == 401
    assert "<html" in page and "Error 401" in page
    status, page = await gw.raw("GET", "", who="eve")  # known, no tenant: still reads
    assert status == 200


async def test_a_long_queue_is_listed_in_part_and_counted(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_gpuaas.gateway import pages

    r = await fill(gw)
    monkeypatch.setattr(pages, "MAX_ROWS", 2)
    status, page = await gw.raw("GET", "", who="root")
    assert status == 200
    # The first two in line, in order; the holder and the last in line are counted.
    assert rows(page) == [r["alice"]["id"], r["bob"]["id"]]
    assert "2 more requests are not listed here" in text(page)


async def test_the_admin_page_says_each_wait_as_the_api_does(gw: Gateway) -> None:
    """One wait sentence, built once (issue 45, Deliver 5): the admin page shows each
    queued request's reason and estimate in the API's own words, nothing added."""
    r = await fill(gw)
    status, page = await gw.raw("GET", "", who="root")
    assert status == 200
    words = text(page)
    said = []
    for who in ("alice", "bob", "carol"):
        api_status, obj = await gw.raw("GET", f"api/requests/{r[who]['id']}", who="root")
        assert api_status == 200 and obj["state"] == "queued", obj
        said.append(obj["waiting_for"]["message"])
    for sentence in set(said):
        # Once on each queued request's row that says it, as it is.
        assert sentence and words.count(sentence) == said.count(sentence), (sentence, words)
        # No clause said twice.
        clauses = [c.strip() for c in re.split(r"[;:]", sentence) if len(c.strip()) > 8]
        assert len(clauses) == len(set(clauses)), sentence
