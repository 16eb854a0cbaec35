"""Preemption with grace through a real gateway subprocess (`jupyter-gpuaas gateway`).

bob's kernel (nlp) borrows vision's GPUs; alice's job (vision, reclaim_within_cohort: Any)
reclaims them. bob hears `preempt_warning` on the event stream, with his request showing
the pending eviction, only once the store holds it; he keeps his GPUs for the grace, then
is preempted and alice admitted. A gateway killed with SIGKILL within the grace evicts at
the deadline it announced, not a new one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from gwutil import TOKENS, GatewayProcess
from helpers import wait_until

from jupyter_gpuaas.client import GatewayClient
from jupyter_gpuaas.gateway.store import Store

pytestmark = pytest.mark.slow


def quotas(grace: float) -> dict[str, Any]:
    return {
        "flavors": {
            "a100": {"nodes": 1, "gpus_per_node": 4},
            "t4": {"nodes": 1, "gpus_per_node": 8},
        },
        "tenants": {
            "vision": {
                "cohort": "lab",
                "quota": {"a100": 2},
                "preemption": {"reclaim_within_cohort": "Any"},
            },
            "nlp": {"cohort": "lab", "quota": {"a100": 2}},
        },
        "policy": {"preemption_grace": grace},
    }


def client(gp: GatewayProcess, who: str) -> GatewayClient:
    return GatewayClient(gp.url, TOKENS[who], timeout=10)


class Listener:
    """One user's event stream, read from the moment it is connected."""

    def __init__(self, c: GatewayClient) -> None:
        self.events: list[dict[str, Any]] = []
        self._task = asyncio.ensure_future(self._read(c))

    async def _read(self, c: GatewayClient) -> None:
        async for ev in c.events(comments=True):
            self.events.append(ev)

    async def connected(self) -> None:
        await until(lambda: _now(any(e.get("comment") == "connected" for e in self.events)))

    async def next(self, name: str, rid: str) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            for ev in self.events:
                if ev.get("event") == name and (ev.get("data") or {}).get("id") == rid:
                    return dict(ev["data"])
            return None

        found: dict[str, Any] = await until(lambda: _now(find()))
        return found

    def close(self) -> None:
        self._task.cancel()


async def _now(value: Any) -> Any:
    return value


async def until(check: Callable[[], Any], timeout: float = 20) -> Any:
    return await wait_until(check, timeout)


@pytest.mark.asyncio
async def test_warning_then_eviction_then_preemptor_admitted(
    spawn_gateway: Callable[..., GatewayProcess], sqlite_url: str
) -> None:
    gp = spawn_gateway(sqlite_url, quotas=quotas(2))
    bob, alice, carol = client(gp, "bob"), client(gp, "alice"), client(gp, "carol")
    k = await bob.submit("nlp", "kernel", 4, name="bob's notebook")
    assert k["state"] == "admitted"
    graces = {t["name"]: t["preemption_grace"] for t in (await bob.tenants())["tenants"]}
    assert graces == {"vision": 2, "nlp": 2}
    bob_events, view_events = Listener(bob), Listener(carol)  # carol has the view scope
    await bob_events.connected()
    await view_events.connected()

    j = await alice.submit("vision", "job", 2)
    assert j["state"] == "queued"
    warning = await bob_events.next("preempt_warning", k["id"])
    assert warning["by"] == j["id"]
    at = warning["at"]
    assert at == pytest.approx(warning["t"] + 2)
    # Committed before it was announced: the store already has the row and the decision.
    store = Store.open(sqlite_url)
    try:
        row = store.get(k["id"])
        assert row is not None and row.state == "admitted"
        assert row.preempt_at == at and row.preempted_by == j["id"]
        logged = [d for d in store.decisions(k["id"]) if d.event == "preempt_warning"]
        assert len(logged) == 1 and json.loads(logged[0].fields)["at"] == at
    finally:
        store.close()
    seen = warning["request"]
    assert seen["state"] == "admitted" and seen["preempt_at"] == at
    assert seen["preempted_by"] == j["id"]
    # bob's 4-GPU kernel, for alice's 2-GPU job: counted, not "its GPUs".
    assert seen["preempt_reason"] == "vision is reclaiming 2 of its 4 GPUs"
    assert (await view_events.next("preempt_warning", k["id"]))["by"] == j["id"]

    # Within the grace: bob keeps all 4 GPUs; alice waits, told why and for how long.
    mine = await bob.get(k["id"])
    assert mine["state"] == "admitted" and len(mine["grant"]["devices"]) == 4
    assert mine["preempt_at"] == at
    waiting = await alice.get(j["id"])
    assert waiting["state"] == "queued"
    basis = waiting["estimated_wait"]["basis"]
    assert basis.startswith("reclaiming 4 GPUs borrowed by nlp, in "), basis
    assert 0 <= waiting["estimated_wait"]["seconds"] <= 2
    assert waiting["waiting_for"] == {"kind": "quota", "message": f"waiting: {basis}"}
    holders = {d["holder"]["id"] for d in (await bob.devices())["devices"] if d["holder"]}
    assert holders == {k["id"]}

    # At the deadline: bob is preempted and alice admitted.
    ended = await bob_events.next("preempt", k["id"])
    assert ended["by"] == j["id"] and ended["t"] >= at
    got = await until(lambda: _admitted(alice, j["id"]))
    assert len(got["grant"]["devices"]) == 2
    gone = await bob.get(k["id"])
    assert gone["state"] == "preempted" and gone["preempt_at"] is None
    bob_events.close()
    view_events.close()


@pytest.mark.asyncio
async def test_cancelled_preemptor_withdraws_the_warning(
    spawn_gateway: Callable[..., GatewayProcess], sqlite_url: str
) -> None:
    gp = spawn_gateway(sqlite_url, quotas=quotas(30))
    bob, alice = client(gp, "bob"), client(gp, "alice")
    k = await bob.submit("nlp", "kernel", 4)
    bob_events = Listener(bob)
    await bob_events.connected()
    j = await alice.submit("vision", "job", 2)
    await bob_events.next("preempt_warning", k["id"])
    await alice.cancel(j["id"])
    withdrawn = await bob_events.next("preempt_withdrawn", k["id"])
    assert withdrawn["by"] == j["id"] and withdrawn["request"]["preempt_at"] is None
    kept = await bob.get(k["id"])
    assert kept["state"] == "admitted" and kept["preempt_at"] is None
    bob_events.close()


@pytest.mark.asyncio
async def test_kill_9_within_the_grace_keeps_the_deadline(
    spawn_gateway: Callable[..., GatewayProcess], db_url: str
) -> None:
    gp = spawn_gateway(db_url, quotas=quotas(4))
    bob, alice = client(gp, "bob"), client(gp, "alice")
    k = await bob.submit("nlp", "kernel", 4)
    j = await alice.submit("vision", "job", 2)
    at = (await until(lambda: _warned(bob, k["id"])))["preempt_at"]
    gp.kill()

    again = spawn_gateway(db_url, quotas=quotas(4))
    bob, alice = client(again, "bob"), client(again, "alice")
    restored = await bob.get(k["id"])
    if restored["state"] == "admitted":  # the restart took less than the grace
        assert restored["preempt_at"] == at and restored["preempted_by"] == j["id"]
        assert (await alice.get(j["id"]))["state"] == "queued"
    got = await until(lambda: _admitted(alice, j["id"]))
    assert got["admitted_at"] >= at
    store = Store.open(db_url)
    try:
        evictions = [d for d in store.decisions(k["id"]) if d.event == "preempt"]
        warnings = [d for d in store.decisions(k["id"]) if d.event == "preempt_warning"]
    finally:
        store.close()
    assert len(warnings) == 1, "the restarted gateway warned again"
    assert len(evictions) == 1 and evictions[0].t >= at
    assert (await bob.get(k["id"]))["state"] == "preempted"


async def _admitted(c: GatewayClient, rid: str) -> dict[str, Any] | None:
    r = await c.get(rid)
    return r if r["state"] == "admitted" else None


async def _warned(c: GatewayClient, rid: str) -> dict[str, Any] | None:
    r = await c.get(rid)
    return r if r.get("preempt_at") else None


def test_migration_0002_keeps_rows_of_a_0001_store(db_url: str) -> None:
    """A store made before preemption with grace upgrades in place: rows kept, no warning."""
    from alembic import command
    from alembic.config import Config as AlembicConfig
    from sqlalchemy import text

    from jupyter_gpuaas.gateway.store import MIGRATIONS, make_engine

    engine = make_engine(db_url)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(
            text(
                'INSERT INTO requests (id, tenant, "user", kind, gpus, priority, busy, state,'
                " submit_time, queue_time, seq, devices, wants_devices, preemptions, culls,"
                " reason, created, updated) VALUES ('r-old', 'nlp', 'bob', 'kernel', 1, 0,"
                " true, 'queued', 1.0, 1.0, 1, '[]', false, 0, 0, '', 1.0, 1.0)"
            )
        )
    engine.dispose()
    store = Store.open(db_url)
    try:
        row = store.get("r-old")
        assert row is not None and row.state == "queued"
        assert row.preempt_at is None and row.preempted_by is None
    finally:
        store.close()
