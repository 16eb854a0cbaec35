"""`GET api/devices` names other users' holders only to the view scope (issue 12).

The sidebar's Devices section shows "another team (nlp)" or "bob (nlp)"; the name must not
reach a browser whose user may not see it, so the gateway leaves it out of the JSON.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from gwutil import Gateway

from jupyter_gpuaas.gateway.openapi import build_openapi

DOC = build_openapi("/")
DEVICES = {"$ref": "#/components/schemas/Device", "components": DOC["components"]}


def holders(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["holder"]["id"]: d["holder"] for d in body["devices"] if d["holder"]}


@pytest.mark.asyncio
async def test_holder_names_only_with_view(gw: Gateway) -> None:
    bob = await gw.client("bob").submit("nlp", "kernel", 1, "a100")
    alice = await gw.client("alice").submit("vision", "kernel", 1, "a100")
    assert bob["state"] == alice["state"] == "admitted"

    seen = {}
    for who in ("alice", "bob", "carol", "root", "eve"):
        status, body = await gw.raw("GET", "api/devices", who=who)
        assert status == 200, body
        for d in body["devices"]:
            jsonschema.validate(d, DEVICES)
        seen[who] = holders(body)
    # Everyone sees that a device is held, by which tenant and kind.
    for who, h in seen.items():
        assert h[bob["id"]]["tenant"] == "nlp" and h[bob["id"]]["kind"] == "kernel", who
    # A plain user: only their own name.
    assert seen["alice"][alice["id"]]["user"] == "alice"
    assert seen["alice"][bob["id"]]["user"] is None
    assert seen["bob"][alice["id"]]["user"] is None
    assert seen["eve"][bob["id"]]["user"] is None
    # The view scope (carol) and an admin see every name.
    assert seen["carol"][bob["id"]]["user"] == "bob"
    assert seen["root"][alice["id"]]["user"] == "alice"
