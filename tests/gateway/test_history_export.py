"""`jupyter-gpuaas history export` from a real gateway's store, SQLite and PostgreSQL: the
requests it saw, with their busy intervals, cancels and the quotas in force, replayed by
`simulate` with a what-if `--set`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from gwutil import TOKENS, call

from jupyter_gpuaas.client import SyncGatewayClient
from jupyter_gpuaas.sim.scenario import load_scenario, parse_override


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_gpuaas.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_gateways_history_replays_as_a_scenario(
    spawn_gateway: Any, db_url: str, tmp_path: Path
) -> None:
    gw = spawn_gateway(db_url, "--GatewayApp.advice_min_grants=1")
    alice, bob, carol, root = (
        SyncGatewayClient(gw.url, TOKENS[who], timeout=10)
        for who in ("alice", "bob", "carol", "root")
    )
    # An admin's override is part of the quotas in force.
    root.put_tenant("nlp", {"cohort": "research", "quota": {"a100": 1}})
    kernel = alice.submit("vision", "kernel", 2, flavor="a100", name="train.ipynb")
    job = bob.submit("nlp", "job", 1, flavor="a100")
    assert kernel["state"] == job["state"] == "admitted"
    waiting = carol.submit("vision", "kernel", 2, flavor="a100")
    assert waiting["state"] == "queued"
    # The kernel goes idle, then busy again: the export gives it two busy intervals.
    time.sleep(0.4)
    alice.heartbeat(kernel["id"], busy=False, utilization=0.02)
    alice.heartbeat(kernel["id"], busy=False)  # a repeat is not a transition
    time.sleep(0.4)
    alice.heartbeat(kernel["id"], busy=True, utilization=0.2)
    time.sleep(0.4)
    carol.cancel(waiting["id"])  # still queued: a cancel
    alice.cancel(kernel["id"])  # admitted: the holder is done (finish)
    # bob's job is still running when the history is exported.

    quotas = tmp_path / "quotas.yaml"  # what the gateway reads (gwutil.write_files)
    out = tmp_path / "mine.yaml"
    done = cli("history", "export", f"--db-url={db_url}", f"--quotas={quotas}", "-o", str(out))
    assert done.returncode == 0, done.stderr
    scenario = yaml.safe_load(out.read_text())
    assert scenario["tenants"]["nlp"] == {"cohort": "research", "quota": {"a100": 1}}
    assert scenario["tenants"]["vision"]["quota"] == {"a100": 4, "t4": 0}
    assert scenario["flavors"]["a100"] == {"nodes": 1, "gpus_per_node": 4}
    reqs = {r["id"]: r for r in scenario["requests"]}
    assert list(reqs) == [kernel["id"], job["id"], waiting["id"]]  # in submit order

    k = reqs[kernel["id"]]
    assert (k["tenant"], k["user"], k["kind"], k["gpus"], k["flavor"]) == (
        "vision",
        "alice",
        "kernel",
        2,
        "a100",
    )
    assert k["submit"] == 0
    (first, second) = k["busy"]
    assert first[0] == 0 and 0.3 <= first[1] < second[0] < second[1] == k["duration"]
    assert 0.3 <= second[0] - first[1] < 5  # the idle spell
    assert k["duration"] >= 1.0

    c = reqs[waiting["id"]]
    assert 1.0 <= c["cancel"] < 30 and "busy" not in c
    assert c["duration"] == k["duration"]  # never admitted: the median hold of its kind

    j = reqs[job["id"]]
    assert "busy" not in j and "cancel" not in j  # busy all along, by the format's default
    assert scenario["until"] >= j["submit"] + j["duration"] - 0.01

    # The simulator accepts it, and a what-if replays it under another quota.
    assert load_scenario(out, [parse_override("tenants.vision.quota.a100=2")]).requests
    sim = cli("simulate", str(out), "--json", "--set", "tenants.vision.quota.a100=2")
    assert sim.returncode == 0, sim.stderr
    result = json.loads(sim.stdout)
    assert set(result["requests"]) == set(reqs)
    assert result["requests"][waiting["id"]]["state"] == "cancelled"

    # advise reads the same store: alice's one kernel peaked at 20% (with a minimum of one
    # grant, for the test; the default is ten).
    base = ["advise", f"--db-url={db_url}", f"--quotas={quotas}"]
    advice = cli(*base, "--min-grants=1", "--json")
    assert advice.returncode == 0, advice.stderr
    (smaller,) = [a for a in json.loads(advice.stdout)["advice"] if a["kind"] == "smaller_gpu"]
    assert smaller["subject"] == "alice" and smaller["evidence"]["p90_peak_utilization"] == 0.2
    quiet = cli(*base)  # ten grants needed by default
    assert quiet.returncode == 0 and quiet.stdout.startswith("No advice: 3 requests"), quiet

    # The same from the gateway (advice_min_grants=1 here): alice reads advice about her
    # own work, bob none of hers, an admin everything; a bad `since` is a 400 naming it.
    status, mine, _ = call(gw.url, "GET", "api/advice?since=30d", who="alice")
    assert status == 200 and mine["requests"] == 3 and mine["min_grants"] == 1
    assert [a["subject"] for a in mine["advice"]] == ["alice"]
    head = smaller["sentence"].split("(")[0]  # the same advice (its period ends later)
    assert mine["advice"][0]["sentence"].startswith(head)
    status, theirs, _ = call(gw.url, "GET", "api/advice", who="bob")
    assert status == 200 and theirs["advice"] == []
    status, everything, _ = call(gw.url, "GET", "api/advice", who="root")
    assert status == 200 and [a["subject"] for a in everything["advice"]] == ["alice"]
    status, bad, _ = call(gw.url, "GET", "api/advice?since=soon", who="root")
    assert status == 400 and bad["field"] == "since", bad


@pytest.mark.slow
def test_bad_arguments_are_one_sentence(tmp_path: Path) -> None:
    done = cli("history", "export", "--db-url=sqlite://", "--quotas=/nope.yaml")
    assert done.returncode == 2
    assert done.stderr.startswith("jupyter-gpuaas history: --quotas: cannot read /nope.yaml")
    (tmp_path / "q.yaml").write_text("flavors: {}\n")
    done = cli(
        "history",
        "export",
        f"--db-url=sqlite:///{tmp_path / 'empty.sqlite'}",
        f"--quotas={tmp_path / 'q.yaml'}",
        "--since=soon",
    )
    assert done.returncode == 2 and "--since/--until: not a length of time: 'soon'" in done.stderr
    assert "Traceback" not in done.stderr
