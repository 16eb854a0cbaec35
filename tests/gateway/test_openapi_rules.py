"""The OpenAPI document and the code hold one set of rules (validate.py's constants).

test_fuzz.py checks it end to end with Schemathesis; these pin the pieces it relies on.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

import jsonschema
import pytest
from gwutil import Gateway
from tornado.httpclient import AsyncHTTPClient

from jupyter_gpuaas.admission.config import TENANT_KEYS
from jupyter_gpuaas.gateway import validate
from jupyter_gpuaas.gateway.openapi import build_openapi

JOB = {"tenant": "vision", "kind": "job", "gpus": 1}


def _param(doc: dict[str, Any], name: str) -> dict[str, Any]:
    params = doc["paths"]["/api/requests"]["get"]["parameters"]
    schema: dict[str, Any] = next(p["schema"] for p in params if p["name"] == name)
    return schema


def test_bounds_come_from_validate() -> None:
    doc = build_openapi()
    submit = doc["components"]["schemas"]["SubmitRequest"]["properties"]
    assert submit["gpus"]["maximum"] == validate.INT32_MAX
    assert submit["priority"]["minimum"] == validate.PRIORITY_MIN
    assert submit["tenant"]["maxLength"] == validate.NAME_MAX
    assert _param(doc, "limit")["maximum"] == validate.LIMIT_MAX
    assert _param(doc, "tenant")["maxLength"] == validate.QUERY_MAX
    # Every key of the quota format, and only those (additionalProperties: false).
    spec = doc["components"]["schemas"]["TenantSpec"]
    assert set(spec["properties"]) == set(TENANT_KEYS) and spec["additionalProperties"] is False


def test_served_document_names_this_gateways_flavors() -> None:
    doc = build_openapi("/", ["t4", "a100"])
    quota = doc["components"]["schemas"]["TenantSpec"]["properties"]["quota"]
    assert quota["propertyNames"] == {"enum": ["a100", "t4"]}
    schema = {"$ref": "#/components/schemas/TenantSpec", "components": doc["components"]}
    jsonschema.validate({"quota": {"a100": 2}, "weight": None}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"quota": {"h100": 2}}, schema)


@pytest.mark.asyncio
async def test_cursor_follows_the_documented_format(gw: Gateway) -> None:
    for _ in range(3):
        assert (await gw.raw("POST", "api/requests", JOB))[0] == 201
    status, page = await gw.raw("GET", "api/requests?limit=2")
    assert status == 200 and len(page) == 2
    # The Link header's cursor matches the document's pattern...
    raw = await AsyncHTTPClient().fetch(
        gw.url + "api/requests?limit=2", headers={"Authorization": "token alice-token-0001"}
    )
    link = raw.headers["Link"]
    cursor = parse_qs(urlparse(link[1 : link.index(">")]).query)["cursor"][0]
    jsonschema.validate(cursor, _param(build_openapi(), "cursor"))
    status, rest = await gw.raw("GET", f"api/requests?limit=2&cursor={cursor}")
    assert status == 200 and [r["id"] for r in rest] == [
        r["id"] for r in (await gw.raw("GET", "api/requests"))[1][2:]
    ], rest
    # ... and any value of that format is a place to resume from (here: before everything).
    status, none = await gw.raw("GET", "api/requests?cursor=0_r-0000000000000000")
    assert status == 200 and none == []
    status, data = await gw.raw("GET", "api/requests?cursor=abc")
    assert status == 400 and data["field"] == "cursor"


@pytest.mark.asyncio
async def test_405_says_which_methods_the_route_has(gw: Gateway) -> None:
    resp = await AsyncHTTPClient().fetch(
        gw.url + "api/requests",
        method="PATCH",
        body="{}",
        headers={"Authorization": "token alice-token-0001"},
        raise_error=False,
    )
    assert resp.code == 405 and resp.headers["Allow"] == "GET, POST"
