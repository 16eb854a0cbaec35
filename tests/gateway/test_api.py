"""The REST API over real HTTP, on SQLite and PostgreSQL, answers checked against the
gateway's own OpenAPI document."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import jsonschema
import pytest
from gwutil import QUOTAS, Gateway
from helpers import wait_until as wait_for

from jupyter_gpuaas.client import GatewayError
from jupyter_gpuaas.gateway.openapi import build_openapi

pytestmark = pytest.mark.asyncio

DOC = build_openapi("/")


def check(schema: str, value: Any) -> None:
    """Validate `value` against components/schemas/<schema> of the OpenAPI document."""
    jsonschema.validate(
        value,
        {"$ref": f"#/components/schemas/{schema}", "components": DOC["components"]},
    )


async def test_submit_admit_queue_cancel(make_gateway: Any, db_url: str) -> None:
    gw: Gateway = await make_gateway(db_url)
    alice = gw.client("alice")
    first = await alice.submit("vision", "kernel", 2, name="nb-1")
    check("Request", first)
    assert first["state"] == "admitted"  # a cycle ran before the answer
    grant = first["grant"]
    assert grant["flavor"] == "a100" and grant["node"] == "a100-0" and len(grant["devices"]) == 2
    assert grant["lease_expires"] > time.time() + 60
    second = await alice.submit("vision", "kernel", 4)
    check("Request", second)
    assert second["state"] == "queued"
    assert second["position"] == {"tenant": 1, "tenant_of": 1, "overall": 1, "of": 1}
    # nothing in use has a known end: no number at all (never 0.0), and it says why
    assert second["estimated_wait"]["seconds"] is None
    assert second["estimated_wait"]["basis"].startswith("no estimate yet")
    assert second["waiting_for"] == {
        "kind": "capacity",
        "message": "waiting: 2 of 4 a100 are free and it needs 4; no estimate yet",
    }

    got = await alice.get(second["id"])
    check("Request", got)
    listed = await alice.list(state="queued")
    for r in listed:
        check("Request", r)
    assert [r["id"] for r in listed] == [second["id"]]
    assert {r["id"] for r in await alice.list(kind="kernel")} == {first["id"], second["id"]}

    released = await alice.cancel(first["id"])
    check("Request", released)
    assert released["state"] == "finished"
    now = await alice.get(second["id"])
    assert now["state"] == "admitted" and len(now["grant"]["devices"]) == 4
    # One grant of a100 was held and released: an estimate if the holder has not yet been
    # held that long (timing decides which: both read as words, never as 0 seconds).
    third = await alice.submit("vision", "job", 1)
    assert third["state"] == "queued"
    wait, why = third["estimated_wait"], third["waiting_for"]
    assert wait["seconds"] is None or wait["seconds"] >= 1, wait
    assert why["message"].startswith("waiting: all 4 a100 are in use; "), why
    if wait["seconds"] is None:
        assert why["message"].endswith("no estimate yet")
    else:
        assert "the next one frees when alice's kernel stops" in why["message"]
    cancelled = await alice.cancel(third["id"])
    assert cancelled["state"] == "cancelled"
    with pytest.raises(GatewayError) as e:
        await alice.cancel(third["id"])
    assert e.value.status == 409


async def test_reject_is_422_and_stored(make_gateway: Any, db_url: str) -> None:
    gw: Gateway = await make_gateway(db_url)
    status, body = await gw.raw(
        "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 9}
    )
    assert status == 422, body
    check("Error", body)
    assert body["field"] == "gpus" and body["error"]
    stored = await gw.client("alice").get(body["id"])
    assert stored["state"] == "rejected" and stored["reason"] == body["error"]
    status, body = await gw.raw(
        "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 1, "flavor": "h100"}
    )
    assert status == 422 and body["field"] == "flavor", body
    status, body = await gw.raw(
        "POST", "api/requests", {"tenant": "nope", "kind": "job", "gpus": 1}
    )
    assert status == 422 and body["field"] == "tenant", body


async def test_devices_tenants_say_simulated(make_gateway: Any, db_url: str) -> None:
    gw: Gateway = await make_gateway(db_url)
    alice = gw.client("alice")
    r = await alice.submit("vision", "kernel", 1)
    devices = await alice.devices()
    check("Devices", devices)
    assert devices["simulated"] is True
    held = [d for d in devices["devices"] if d["holder"]]
    assert [d["holder"]["id"] for d in held] == [r["id"]]
    tenants = await alice.tenants()
    check("Tenants", tenants)
    assert tenants["simulated"] is True
    vision = next(t for t in tenants["tenants"] if t["name"] == "vision")
    a100 = next(u for u in vision["usage"] if u["flavor"] == "a100")
    assert a100["admitted"] == 1 and a100["quota"] == 4


async def test_put_tenant_changes_quota(make_gateway: Any, db_url: str) -> None:
    gw: Gateway = await make_gateway(db_url)
    bob = gw.client("bob")
    a = await bob.submit("nlp", "job", 2)
    b = await bob.submit("nlp", "job", 2)
    assert (a["state"], b["state"]) == ("admitted", "queued")
    spec = {"cohort": "research", "quota": {"a100": 4}}
    answer = await gw.client("root").put_tenant("nlp", spec)
    check("Tenant", answer)
    assert answer["quota"] == {"a100": 4} and answer["simulated"] is True
    assert (await bob.get(b["id"]))["state"] == "admitted"
    status, body = await gw.raw("PUT", "api/tenants/nlp", {"quota": {"a100": -1}}, who="root")
    assert status == 400 and body["field"] == "tenants.nlp.quota.a100", body
    # the override survives a restart of the store's reader
    assert gw.arbiter.store.tenant_overrides()["nlp"] == spec


async def test_heartbeat(make_gateway: Any, db_url: str) -> None:
    gw: Gateway = await make_gateway(db_url)
    alice = gw.client("alice")
    a = await alice.submit("vision", "kernel", 4)
    q = await alice.submit("vision", "kernel", 1)
    before = a["grant"]["lease_expires"]
    await asyncio.sleep(0.05)
    hb = await alice.heartbeat(a["id"], busy=False, utilization=0.25)
    check("Request", hb)
    assert hb["grant"]["lease_expires"] > before
    assert hb["grant"]["busy"] is False and hb["grant"]["utilization"] == 0.25
    row = gw.arbiter.store.get(a["id"])
    assert row.lease_expires == hb["grant"]["lease_expires"]  # persisted, for restarts
    with pytest.raises(GatewayError) as e:
        await alice.heartbeat(q["id"], busy=True)
    assert e.value.status == 409


@pytest.mark.slow
async def test_lease_expiry_releases_to_next(make_gateway: Any) -> None:
    gw: Gateway = await make_gateway(lease_ttl=1.0)
    alice = gw.client("alice")
    a = await alice.submit("vision", "kernel", 4)
    b = await alice.submit("vision", "kernel", 4)
    assert b["state"] == "queued"
    for _ in range(4):  # a heartbeating holder keeps its grant past the TTL
        await asyncio.sleep(0.4)
        await alice.heartbeat(a["id"], busy=True)
    assert (await alice.get(a["id"]))["state"] == "admitted"

    async def b_admitted() -> bool:
        return (await alice.get(b["id"]))["state"] == "admitted"

    t0 = time.monotonic()
    await wait_for(b_admitted, timeout=4)
    assert time.monotonic() - t0 < 2.5
    gone = await alice.get(a["id"])
    assert gone["state"] == "finished" and gone["reason"] == "lease expired"


async def test_idle_cull_park_and_resume(make_gateway: Any) -> None:
    quotas = {
        **QUOTAS,
        "policy": {"idle_timeout": 0.6, "reservation_ttl": 30, "cull_warning": 0.3},
    }
    gw: Gateway = await make_gateway(quotas=quotas)
    alice = gw.client("alice")
    k = await alice.submit("vision", "kernel", 2)
    await alice.heartbeat(k["id"], busy=False)

    async def parked() -> bool:
        return (await alice.get(k["id"]))["state"] == "parked"

    await wait_for(parked, timeout=4)
    events = [d.event for d in gw.arbiter.store.decisions(k["id"])]
    assert events[:2] == ["submit", "admit"] and "cull_warning" in events and "cull" in events
    # bob cannot take vision's parked quota... but alice resumes at once
    again = await alice.submit("vision", "kernel", 2)
    assert again["state"] == "admitted", again
    old = await alice.get(k["id"])
    assert old["state"] == "finished" and "claimed" in old["reason"]
    admit = [d for d in gw.arbiter.store.decisions(again["id"]) if d.event == "admit"]
    assert '"resumed_from"' in admit[0].fields
    # How long after the cull alice came back: the wait estimates' history keeps it.
    (delay,) = gw.arbiter.history.returns("kernel")
    cull = next(d for d in gw.arbiter.store.decisions(k["id"]) if d.event == "cull")
    assert 0.0 <= delay <= admit[0].t - cull.t
    # Her hold goes on in the new request: the claimed one ended none. Released, the
    # hold is one sample, from her first kernel's admission, with its one cull.
    assert gw.arbiter.history.holds("kernel") == []
    first = next(d for d in gw.arbiter.store.decisions(k["id"]) if d.event == "admit")
    await alice.cancel(again["id"])
    end = next(d for d in gw.arbiter.store.decisions(again["id"]) if d.event == "finish")
    assert gw.arbiter.history.holds("kernel", "alice") == [pytest.approx(end.t - first.t)]
    assert gw.arbiter.history.culls("kernel") == (1, 0)  # one cull, and she came back


async def test_an_idle_spell_heard_to_end_is_kept_for_the_estimates(make_gateway: Any) -> None:
    """A holder idle, then busy again before its cull: how long it was idle goes into
    the wait estimates' history (`History.busy_before_cull`: idle holders are not all
    culled), once the heartbeat is committed; a busy heartbeat that ends no spell adds
    none."""
    quotas = {**QUOTAS, "policy": {"idle_timeout": 60}}
    gw: Gateway = await make_gateway(quotas=quotas)
    alice = gw.client("alice")
    k = await alice.submit("vision", "kernel", 1)
    await alice.heartbeat(k["id"], busy=True)
    assert gw.arbiter.history.idle_spells("kernel") == []
    await asyncio.sleep(0.3)  # (busy since its admission: the spell starts below)
    before_idle = time.time()
    await alice.heartbeat(k["id"], busy=False)
    idle_at = time.time()
    await asyncio.sleep(0.3)
    before_busy = time.time()
    await alice.heartbeat(k["id"], busy=True)
    (spell,) = gw.arbiter.history.idle_spells("kernel")
    assert before_busy - idle_at <= spell <= time.time() - before_idle


async def test_simulated_scale_up_tells_waiters(make_gateway: Any) -> None:
    quotas = {
        **QUOTAS,
        "policy": {"autoscale": {"a100": {"max_nodes": 2, "provision_delay": 0.8}}},
    }
    gw: Gateway = await make_gateway(quotas=quotas, scaler="simulated")
    alice, bob = gw.client("alice"), gw.client("bob")
    await alice.submit("vision", "job", 4)
    waiting = await bob.submit("nlp", "job", 2)
    assert waiting["state"] == "queued"
    assert waiting["scaling"]["flavor"] == "a100" and waiting["scaling"]["nodes"] == 1
    assert waiting["scaling"]["ready_by"] > time.time()
    check("Request", waiting)

    async def admitted() -> dict[str, Any] | None:
        r = await bob.get(waiting["id"])
        return r if r["state"] == "admitted" else None

    r = await wait_for(admitted, timeout=4)
    assert r["grant"]["node"] == "a100-1"
    devices = await bob.devices()
    assert {n["name"] for n in devices["nodes"]} >= {"a100-0", "a100-1"}
    assert [n.name for n in gw.arbiter.store.nodes()] == ["a100-1"]


async def test_metrics_and_openapi(gw: Gateway) -> None:
    alice = gw.client("alice")
    await alice.submit("vision", "kernel", 1)
    status, text = await gw.raw("GET", "metrics", who="carol")  # view scope
    assert status == 200
    assert 'gpuaas_admitted_gpus{flavor="a100",tenant="vision"} 1.0' in text
    assert "gpuaas_admission_wait_seconds_count" in text
    status, doc = await gw.raw("GET", "api/openapi.json", who=None)
    assert status == 200 and doc["openapi"].startswith("3.")
    assert "/api/requests/{id}/heartbeat" in doc["paths"]


async def test_non_view_sees_only_own(gw: Gateway) -> None:
    await gw.client("alice").submit("vision", "job", 1)
    await gw.client("bob").submit("nlp", "job", 1)
    assert {r["user"] for r in await gw.client("alice").list()} == {"alice"}
    assert {r["user"] for r in await gw.client("carol").list()} == {"alice", "bob"}
    assert {r["user"] for r in await gw.client("root").list(user="bob")} == {"bob"}
