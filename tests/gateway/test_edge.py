"""Bad input stopped at the edge, over real HTTP: 400 naming the field, never a 500.

Also the body limit (413 before the body is read, after authentication), keyset
pagination with RFC 8288 `Link` headers, and the health route.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from gwutil import TOKENS, Gateway

JOB = {"tenant": "vision", "kind": "job", "gpus": 1}

BAD_BODIES = [
    (b"[" * 1000 + b"]" * 1000, None),  # nested 1,000 deep: RecursionError inside json
    (b'{"a":' * 100 + b"1" + b"}" * 100, None),  # deep but under the parser's limit
    (json.dumps({**JOB, "priority": 2**63}).encode(), "priority"),
    (json.dumps({**JOB, "priority": 2**31}).encode(), "priority"),
    (json.dumps({**JOB, "gpus": 2**63}).encode(), "gpus"),
    (json.dumps({**JOB, "gpus": 1.5}).encode(), "gpus"),
    (json.dumps({**JOB, "name": "\ud800"}).encode(), "name"),
    (json.dumps({**JOB, "name": "nb\u0000"}).encode(), "name"),
    (json.dumps({**JOB, "name": "n" * 256}).encode(), "name"),
    (json.dumps({**JOB, "tenant": "\ud800"}).encode(), "tenant"),
    (json.dumps({**JOB, "tenant": "Vision"}).encode(), "tenant"),
    (json.dumps({**JOB, "tenant": "v" * 64}).encode(), "tenant"),
    (json.dumps({**JOB, "flavor": "../a100"}).encode(), "flavor"),
    (json.dumps({**JOB, "kind": ["job"]}).encode(), "kind"),
    (b'{"tenant": "vision", "kind": "job", "gpus": NaN}', None),
    (b'{"tenant": "vision", "kind": "job", "gpus": 1' + b"0" * 50 + b"}", None),
    (b'{"tenant": "vision", "kind": "job", "gpus": 1, "name": "\xff"}', None),
]


@pytest.mark.asyncio
async def test_bad_bodies_are_400_naming_the_field(gw: Gateway) -> None:
    for body, field in BAD_BODIES:
        status, data = await gw.raw("POST", "api/requests", body)
        assert status == 400, (body[:60], data)
        assert isinstance(data, dict) and data["error"], data
        if field is not None:
            assert data["field"] == field and field in data["error"], (body[:60], data)
    status, data = await gw.raw("POST", "api/requests/r-0123456789abcdef/heartbeat", b"[" * 5000)
    assert status == 400, data
    # bounds that pass: the documented extremes of priority, and a MIG flavor's name
    for priority in (2**31 - 1, -(2**31) + 1):
        status, data = await gw.raw("POST", "api/requests", {**JOB, "priority": priority})
        assert status == 201 and data["priority"] == priority, data
    status, data = await gw.raw("POST", "api/requests", {**JOB, "flavor": "a100-mig-1g.10gb"})
    assert status == 422 and data["field"] == "flavor", data  # a name, but no such flavor
    assert (await gw.raw("POST", "api/requests", {**JOB, "gpus": 9}))[0] == 422  # too wide
    # 1.0 is an integer to JSON Schema, so to the document and the gateway too
    status, data = await gw.raw("POST", "api/requests", {**JOB, "gpus": 1.0})
    assert status == 201 and data["gpus"] == 1 and isinstance(data["gpus"], int), data


@pytest.mark.asyncio
async def test_bad_queries_and_paths(gw: Gateway) -> None:
    for query, field in (
        ("limit=%C2%B2", "limit"),  # '²': str.isdigit() says yes, int() says no
        ("limit=%D9%A1", "limit"),  # Arabic-Indic one
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("cursor=abc", "cursor"),
        ("state=nope", "state"),
        ("tenant=" + "t" * 300, "tenant"),
    ):
        status, data = await gw.raw("GET", f"api/requests?{query}", who="root")
        assert status == 400 and data["field"] == field, (query, data)
    status, data = await gw.raw("GET", "api/requests/" + "x" * 5000)
    assert status == 404, data
    for name in ("..%2Fetc", "%3Cscript%3E", "a" * 300, "nul%00", "UPPER"):
        status, data = await gw.raw("PUT", f"api/tenants/{name}", {"quota": {"a100": 1}}, "root")
        assert status == 400 and data["field"] == "name", (name, data)
    status, data = await gw.raw(
        "PUT", "api/tenants/ok", {"quota": {"a100": 1}, "cohort": "Research Lab"}, "root"
    )
    assert status == 400 and data["field"] == "cohort", data
    status, data = await gw.raw("PUT", "api/tenants/course-101", {"quota": {"a100": 1}}, "root")
    assert status == 200 and data["name"] == "course-101", data


async def raw_exchange(gw: Gateway, head: bytes, body: bytes = b"") -> bytes:
    """Send exactly these bytes and read the answer until the server closes."""
    host, port = gw.url.split("//")[1].split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return answer


@pytest.mark.asyncio
async def test_a_large_body_is_refused_unread_after_authentication(gw: Gateway) -> None:
    # 57 MB announced, none sent: the answer comes anyway, so nothing was buffered
    head = (
        "POST /api/requests HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 57000000\r\n"
    )
    anonymous = await raw_exchange(gw, (head + "\r\n").encode())
    assert anonymous.startswith(b"HTTP/1.1 401"), anonymous[:200]
    authed = await raw_exchange(
        gw, (head + f"Authorization: token {TOKENS['alice']}\r\n\r\n").encode()
    )
    assert authed.startswith(b"HTTP/1.1 413"), authed[:200]
    body = json.loads(authed.split(b"\r\n\r\n", 1)[1])
    assert "64 KiB" in body["error"], body
    # a 10 MB cohort string never reaches the parser
    spec = json.dumps({"quota": {"a100": 1}, "cohort": "c" * 10_000_000})
    status, data = await gw.raw("PUT", "api/tenants/big", spec, "root")
    assert status == 413, data
    # the gateway still answers everyone
    assert (await gw.raw("GET", "api/me"))[0] == 200


@pytest.mark.asyncio
async def test_pagination_follows_link_headers(gw: Gateway) -> None:
    from tornado.httpclient import AsyncHTTPClient

    ids = set()
    for _ in range(7):
        status, data = await gw.raw("POST", "api/requests", {**JOB, "kind": "kernel"})
        assert status in (201, 422), data
        ids.add(data["id"])
    seen: list[str] = []
    url: str | None = gw.url + "api/requests?limit=3&kind=kernel"
    pages = 0
    while url:
        resp = await AsyncHTTPClient().fetch(
            url, headers={"Authorization": f"token {TOKENS['alice']}"}
        )
        pages += 1
        seen += [r["id"] for r in json.loads(resp.body)]
        link = resp.headers.get("Link")
        url = None
        if link:
            m = re.fullmatch(r'<([^>]+)>; rel="next"', link)
            assert m, link
            url = gw.url[: gw.url.index("/", 8)] + m.group(1)  # an absolute path
    assert pages == 3 and len(seen) == len(set(seen)) == 7 and set(seen) == ids


@pytest.mark.asyncio
async def test_health_needs_no_token(gw: Gateway) -> None:
    status, data = await gw.raw("GET", "api/health", who=None)
    assert status == 200 and data == {"status": "ok", "store": "ok", "leader": True}, data
    gw.arbiter.broken = "a test broke it"
    try:
        status, data = await gw.raw("GET", "api/health", who=None)
        assert status == 503 and data["status"] == "unavailable", data
        status, data = await gw.raw("GET", "api/requests")
        assert status == 503 and "try again" in data["error"], data
    finally:
        gw.arbiter.broken = None


def test_openapi_document_matches_the_code() -> None:
    import jsonschema

    from jupyter_gpuaas.gateway.handlers import routes
    from jupyter_gpuaas.gateway.openapi import build_openapi

    doc = build_openapi("/")
    documented = {re.sub(r"\{[^}]+\}", "([^/]+)", p).replace(".", r"\.") for p in doc["paths"]}
    for pattern, _ in routes("/"):
        assert pattern in documented, f"route {pattern} is not in the OpenAPI document"
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if op.get("security") == []:
                continue  # anyone: openapi.json, metrics, health
            assert {"401", "403", "503"} <= set(op["responses"]), (method, path)
            assert "Retry-After" in op["responses"]["503"]["headers"]
            if method in ("post", "put"):
                assert op["requestBody"]["required"] is True, (method, path)
    params = {p["name"]: p["schema"] for p in doc["paths"]["/api/requests"]["get"]["parameters"]}
    assert params["limit"]["type"] == "integer" and "enum" in params["state"]
    assert set(params["kind"]["enum"]) == {"server", "kernel", "job"}
    # The schema refuses what the code refuses (where JSON Schema can say it).
    submit = {"$ref": "#/components/schemas/SubmitRequest", "components": doc["components"]}
    jsonschema.validate({**JOB, "flavor": "a100-mig-1g.10gb", "priority": -5}, submit)
    for body, field in BAD_BODIES:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            continue
        if field is None:
            continue
        if any(isinstance(v, str) and "\ud800" in v for v in data.values()):
            continue  # a lone surrogate cannot be described in JSON Schema
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, submit)


@pytest.mark.asyncio
@pytest.mark.slow
async def test_slow_headers_and_bodies_are_cut_off(make_gateway: Any) -> None:
    gw = await make_gateway(header_timeout=1.0, body_timeout=1.0)
    host, port = gw.url.split("//")[1].split("/")[0].split(":")
    for partial in (
        b"GET /api/me HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        (
            f"POST /api/requests HTTP/1.1\r\nHost: x\r\nAuthorization: token {TOKENS['alice']}"
            "\r\nContent-Length: 100\r\n\r\n{"
        ).encode(),  # a body that stops after one byte
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(partial)
        await writer.drain()
        # the server closes the connection (EOF) instead of waiting forever
        rest = await asyncio.wait_for(reader.read(), timeout=15)
        assert b"201" not in rest
        writer.close()
    assert (await gw.raw("GET", "api/me"))[0] == 200
