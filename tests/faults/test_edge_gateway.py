"""Bad input at the gateway's edge (issue 40, items 5, 6 and 8), against a real
`jupyter-gpuaas gateway` process over real HTTP, one per module:

- a `Last-Event-ID` that is no id (4,301 digits) is a 400 with a sentence, and leaves no
  listener behind (the gateway's own `gpuaas_event_streams` gauge, read from `metrics`);
- duplicate JSON keys are a 400 naming the key; a body that does not say it is JSON is
  a 415;
- every JSON answer, errors included, carries the CSP and nosniff headers;
- every admin value of a tenant has a ceiling in the OpenAPI document, enforced;
- one user may queue at most `max_queued_per_user` requests (429 with a sentence);
- a wait sentence names another user's grant by tenant only (the view rule).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from gwutil import TOKENS, launch_gateway
from helpers import wait_for

pytestmark = pytest.mark.slow  # a gateway process for the module

CSP = "default-src 'none'; frame-ancestors 'none'"
JOB = {"tenant": "vision", "kind": "job", "gpus": 1}
QUOTAS: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}, "t4": {"nodes": 1, "gpus_per_node": 8}},
    "tenants": {
        "vision": {"cohort": "research", "quota": {"a100": 4, "t4": 8}},
        "nlp": {"cohort": "research", "quota": {"a100": 2}, "borrowing_limit": {"a100": 0}},
    },
    # An idle kernel is culled after 10 minutes: its end is known, and said in a wait.
    "policy": {"idle_timeout": 600},
}


class Gw:
    def __init__(self, url: str, proc: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.proc = proc

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        who: str | None = "alice",
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON or text, headers); a dict body is sent as JSON with its type.
        Status 0: no whole answer within `timeout` seconds."""
        hdrs = dict(headers or {})
        data = body
        if body is not None and not isinstance(body, bytes):
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        if who is not None:
            req.add_header("Authorization", f"token {TOKENS[who]}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw, got = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as e:
            try:
                status, raw, got = e.code, e.read(), dict(e.headers)
            except TimeoutError:
                return 0, f"{e.code}, then no end of the body", {}
        except (TimeoutError, urllib.error.URLError) as e:
            return 0, str(e), {}
        try:
            return status, json.loads(raw), got
        except ValueError:
            return status, raw.decode(errors="replace"), got

    def metric(self, name: str) -> float:
        status, text, _ = self.call("GET", "metrics", who="root")
        assert status == 200, text
        match = re.search(rf"^{name} (\S+)$", text, re.M)
        assert match, f"{name} is not exported"
        return float(match.group(1))


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gw]:
    gp = launch_gateway(
        tmp_path_factory.mktemp("edge-gateway"),
        None,
        "--GatewayApp.max_queued_per_user=3",
        "--GatewayApp.keepalive_interval=0.5",
        quotas=QUOTAS,
    )
    yield Gw(gp.url, gp.proc)
    gp.stop()


def _clear(gw: Gw) -> None:
    """Cancel every live request (each test starts from idle devices)."""
    status, listed, _ = gw.call("GET", "api/requests", who="root")
    assert status == 200, listed
    for r in listed:
        if r["state"] in ("queued", "admitted", "parked"):
            gw.call("DELETE", f"api/requests/{r['id']}", who="root")


def test_a_4301_digit_last_event_id_is_a_400_and_keeps_no_listener(gw: Gw) -> None:
    for _ in range(50):
        status, body, headers = gw.call(
            "GET", "api/events", headers={"Last-Event-ID": "0-" + "1" * 4301}
        )
        assert status == 400, body
        assert body["field"] == "Last-Event-ID" and "4303 characters" in body["error"], body
        assert headers["Content-Type"].startswith("application/json")
    for garbage in ("1" * 4301, "x" * 65, "caf\u00e9-1", "one two"):
        status, body, _ = gw.call(
            "GET", "api/events", headers={"Last-Event-ID": garbage.encode().decode("latin-1")}
        )
        assert status == 400 and body["field"] == "Last-Event-ID", (garbage, body)
    # The gateway's own count of its listeners: none was registered for any of them.
    assert gw.metric("gpuaas_event_streams") == 0
    # An unknown but well-formed id is no error: a `reset`, and the stream goes on.
    req = urllib.request.Request(
        gw.url + "api/events",
        headers={"Authorization": f"token {TOKENS['carol']}", "Last-Event-ID": "0000-7"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        head = b""
        while b"event: reset" not in head or not head.endswith(b"\n\n"):
            head += resp.read1(4096)
        assert b"list the requests again" in head
        assert gw.metric("gpuaas_event_streams") == 1
    wait_for(lambda: gw.metric("gpuaas_event_streams") == 0, 10, "the stream to be let go",
             interval=0.2)  # fmt: skip


def test_duplicate_keys_are_a_400_naming_the_key(gw: Gw) -> None:
    body = b'{"tenant": "vision", "kind": "job", "gpus": 1, "gpus": 4}'
    status, data, _ = gw.call(
        "POST", "api/requests", body, headers={"Content-Type": "application/json"}
    )
    assert status == 400, data
    assert data["field"] == "gpus" and "'gpus'" in data["error"] and "once" in data["error"], data
    nested = b'{"quota": {"a100": 1, "a100": 4}}'
    status, data, _ = gw.call(
        "PUT", "api/tenants/nlp", nested, who="root", headers={"Content-Type": "application/json"}
    )
    assert status == 400 and data["field"] == "a100", data
    status, data, _ = gw.call(
        "POST",
        "api/requests/r-0123456789abcdef/heartbeat",
        b'{"busy": true, "busy": false}',
        headers={"Content-Type": "application/json"},
    )
    assert status == 400 and data["field"] == "busy", data


def test_a_body_that_is_not_json_is_a_415(gw: Gw) -> None:
    body = json.dumps(JOB).encode()
    for content_type in (
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonp",
    ):
        headers = {} if content_type is None else {"Content-Type": content_type}
        status, data, _ = gw.call("POST", "api/requests", body, headers=headers)
        assert status == 415, (content_type, data)
        assert data["field"] == "Content-Type" and "application/json" in data["error"], data
    status, data, _ = gw.call(
        "PUT",
        "api/tenants/nlp",
        json.dumps({"quota": {"a100": 2}}).encode(),
        who="root",
        headers={"Content-Type": "text/plain"},
    )
    assert status == 415, data
    # What our clients send is taken.
    for content_type in ("application/json", "application/json; charset=utf-8",
                         'Application/JSON; charset="UTF-8"'):  # fmt: skip
        status, data, _ = gw.call(
            "POST", "api/requests", body, headers={"Content-Type": content_type}
        )
        assert status == 201, (content_type, data)
    _clear(gw)


def test_every_json_answer_carries_the_security_headers(gw: Gw) -> None:
    calls: list[tuple[str, str, Any, str | None]] = [
        ("GET", "api/me", None, "alice"),
        ("GET", "api/requests", None, "alice"),
        ("GET", "api/devices", None, "alice"),
        ("GET", "api/tenants", None, "alice"),
        ("GET", "api/openapi.json", None, None),
        ("GET", "api/health", None, None),
        ("GET", "api/requests", None, None),  # 401
        ("GET", "api/nothing-here", None, "alice"),  # 404
        ("GET", "api/requests?limit=0", None, "alice"),  # 400
        ("PUT", "api/requests", JOB, "alice"),  # 405
        ("POST", "api/requests", {**JOB, "gpus": 0}, "alice"),  # 400
        ("POST", "api/requests", b"{}", "alice"),  # 415 (no Content-Type)
        ("PUT", "api/tenants/nlp", {"quota": {"a100": 2}}, "alice"),  # 403
        ("GET", "api/events", None, "alice"),  # 400 below: a bad Last-Event-ID
    ]
    seen = set()
    for method, path, body, who in calls:
        headers = {"Last-Event-ID": "9" * 100} if path == "api/events" else None
        status, _, got = gw.call(method, path, body, who=who, headers=headers)
        seen.add(status)
        assert got["Content-Type"].startswith("application/json"), (path, got)
        assert got.get("Content-Security-Policy") == CSP, (method, path, status, got)
        assert got.get("X-Content-Type-Options") == "nosniff", (method, path, status, got)
    status, _, got = gw.call("POST", "api/requests", JOB)
    assert status == 201 and got.get("Content-Security-Policy") == CSP
    assert got.get("X-Content-Type-Options") == "nosniff"
    assert {200, 201, 400, 401, 403, 404, 405, 415} <= seen | {201}, seen
    _clear(gw)


def _numbers(schema: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every number or integer schema under `schema`, with its path."""
    if isinstance(schema, dict):
        types = schema.get("type")
        types = types if isinstance(types, list) else [types]
        if "number" in types or "integer" in types:
            yield where, schema
        for key, value in schema.items():
            if key in ("properties",):
                for name, sub in value.items():
                    yield from _numbers(sub, f"{where}.{name}")
            elif key in ("additionalProperties", "items"):
                yield from _numbers(value, f"{where}[*]")
            elif key in ("anyOf", "oneOf", "allOf"):
                for sub in value:
                    yield from _numbers(sub, where)


def test_every_admin_value_has_a_ceiling_and_it_is_enforced(gw: Gw) -> None:
    status, doc, _ = gw.call("GET", "api/openapi.json", who=None)
    assert status == 200
    spec = doc["components"]["schemas"]["TenantSpec"]
    numbers = dict(_numbers(spec, "TenantSpec"))
    assert "TenantSpec.preemption_grace" in numbers and "TenantSpec.quota[*]" in numbers
    unbounded = [path for path, s in numbers.items() if "maximum" not in s]
    assert not unbounded, f"admin values without a maximum: {unbounded}"
    for key in ("preemption_grace", "idle_timeout", "reservation_ttl", "weight"):
        ceiling = numbers[f"TenantSpec.{key}"]["maximum"]
        spec_ = {"cohort": "research", "quota": {"a100": 2}, key: ceiling * 10}
        status, data, _ = gw.call("PUT", "api/tenants/nlp", spec_, who="root")
        assert status == 400 and data["field"] == key, (key, data)
        assert "must be at most" in data["error"] and key in data["error"], data
        status, data, _ = gw.call("PUT", "api/tenants/nlp", {**spec_, key: ceiling}, who="root")
        assert status == 200, (key, data)
    status, data, _ = gw.call(
        "PUT", "api/tenants/nlp", {"cohort": "research", "quota": {"a100": 1e308}}, who="root"
    )
    assert status == 400 and data["field"] == "quota.a100", data
    big = numbers["TenantSpec.quota[*]"]["maximum"]
    status, data, _ = gw.call(
        "PUT", "api/tenants/nlp", {"cohort": "research", "quota": {"a100": big + 1}}, who="root"
    )
    assert status == 400 and data["field"] == "quota.a100", data
    status, data, _ = gw.call(
        "PUT", "api/tenants/nlp",
        {"cohort": "research", "quota": {"a100": 2}, "borrowing_limit": {"a100": 0}},
        who="root",
    )  # fmt: skip
    assert status == 200, data


def test_one_user_queues_at_most_max_queued_per_user(gw: Gw) -> None:
    _clear(gw)
    # alice holds the four a100; then her next three queue, and the fourth is refused.
    status, held, _ = gw.call(
        "POST", "api/requests", {**JOB, "kind": "kernel", "gpus": 4, "flavor": "a100"}
    )
    assert status == 201 and held["state"] == "admitted", held
    queued = []
    for _ in range(3):
        status, data, _ = gw.call("POST", "api/requests", {**JOB, "flavor": "a100"})
        assert status == 201 and data["state"] == "queued", data
        queued.append(data["id"])
    status, data, headers = gw.call("POST", "api/requests", {**JOB, "flavor": "a100"})
    assert status == 429, data
    assert "3 requests waiting in the queue" in data["error"] and "cancel one" in data["error"]
    assert headers.get("X-Content-Type-Options") == "nosniff"
    # Nothing was kept of the refused one; another user is not held back by alice's share.
    status, listed, _ = gw.call("GET", "api/requests?state=queued", who="root")
    assert sorted(r["id"] for r in listed) == sorted(queued)
    status, data, _ = gw.call(
        "POST", "api/requests", {"tenant": "nlp", "kind": "job", "gpus": 1}, who="bob"
    )
    assert status == 201, data
    # Room again once one is cancelled.
    gw.call("DELETE", f"api/requests/{queued[0]}")
    status, data, _ = gw.call("POST", "api/requests", {**JOB, "flavor": "a100"})
    assert status == 201 and data["state"] == "queued", data
    _clear(gw)


def test_a_wait_sentence_names_another_users_grant_by_tenant_only(gw: Gw) -> None:
    _clear(gw)
    status, held, _ = gw.call(
        "POST", "api/requests", {"tenant": "vision", "kind": "kernel", "gpus": 4, "flavor": "a100"}
    )
    assert status == 201 and held["state"] == "admitted", held
    # Idle: it will be culled (policy idle_timeout), so its end is known and said.
    status, data, _ = gw.call("POST", f"api/requests/{held['id']}/heartbeat", {"busy": False})
    assert status == 200, data
    status, bobs, _ = gw.call(
        "POST",
        "api/requests",
        {"tenant": "nlp", "kind": "job", "gpus": 1, "flavor": "a100"},
        who="bob",
    )
    assert status == 201 and bobs["state"] == "queued", bobs
    for who in ("bob", "carol"):  # bob has no view; carol reads bob's request as bob does
        status, obj, _ = gw.call("GET", f"api/requests/{bobs['id']}", who=who)
        assert status == 200, obj
        message = obj["waiting_for"]["message"]
        assert "another user of vision" in message, message
        assert "alice" not in json.dumps(obj["waiting_for"]) + json.dumps(obj["estimated_wait"])
    # bob cannot read alice's name in the devices either (the rule the sentence follows)
    status, devices, _ = gw.call("GET", "api/devices", who="bob")
    assert "alice" not in json.dumps(devices)
    # alice's own queued request names her own grant
    status, mine, _ = gw.call(
        "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1, "flavor": "a100"}
    )
    assert status == 201 and mine["state"] == "queued", mine
    assert "alice's idle kernel" in mine["waiting_for"]["message"], mine["waiting_for"]
    _clear(gw)
