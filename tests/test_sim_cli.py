"""`jupyter-gpuaas simulate`: the CLI's contract, the result shape and what a run leaves.

Result-shape tests run in-process against a stand-in driver (so they do not depend on the
core's decisions), and again against the real driver when `jupyter_gpuaas.sim.driver`
exists, through the real console script. Parsing and its one-line errors are in
test_sim_cli_parsing.py, the result object's arithmetic in test_sim_cli_result.py, what
they share in simutil.py.
"""

from __future__ import annotations

import copy
import io
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from simutil import (
    EXAMPLE,
    ROOT,
    SCENARIOS,
    assert_one_line_error,
    base_scenario,
    csv_scenario,
    needs_driver,
    simulate,
    write,
)

from jupyter_gpuaas.admission.model import Decision
from jupyter_gpuaas.cli import main
from jupyter_gpuaas.sim.report import Tally, build_result
from jupyter_gpuaas.sim.scenario import Scenario, load_scenario

# --- the CLI with a stand-in driver -----------------------------------------------------


@dataclass
class _FakeRun:
    decisions: list[Decision]
    end: float


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float | None]]:
    """A stand-in `jupyter_gpuaas.sim.driver`: admits everything at submit on a100-0. Like
    the real one, with a `tally` it hands the decisions to it and keeps none."""
    untils: list[float | None] = []

    def run_scenario(
        scenario: Scenario, until: float | None = None, tally: Tally | None = None
    ) -> _FakeRun:
        untils.append(until)
        out: list[Decision] = []
        end = 0.0
        for r in scenario.requests:
            out.append(
                Decision(
                    r.submit, "submit", r.id, {"tenant": r.tenant, "kind": r.kind, "gpus": r.gpus}
                )
            )
            out.append(
                Decision(
                    r.submit,
                    "admit",
                    r.id,
                    {
                        "tenant": r.tenant,
                        "flavor": "a100",
                        "gpus": r.gpus,
                        "node": "a100-0",
                        "devices": list(range(r.gpus)),
                    },
                )
            )
            stop = r.submit + r.duration
            if until is None or stop <= until:
                out.append(Decision(stop, "finish", r.id))
            end = max(end, stop)
        out.sort(key=lambda d: d.t)
        if tally is not None:
            tally.add(out)
            out = []
        return _FakeRun(out, end if until is None else until)

    module = types.ModuleType("jupyter_gpuaas.sim.driver")
    module.run_scenario = run_scenario  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jupyter_gpuaas.sim.driver", module)
    yield untils


SUMMARY_KEYS = {
    "requests",
    "admitted",
    "rejected",
    "never_admitted",
    "wait_p50",
    "wait_p95",
    "wait_max",
    "gpu_hours_capacity",
    "gpu_hours_allocated",
    "gpu_hours_busy",
    "gpu_hours_idle_allocated",
    "utilization",
    "node_hours",
    "per_tenant",
}
REQUEST_RESULT_KEYS = {"state", "admitted_at", "wait", "flavor", "preemptions", "culls"}


def assert_result_shape(result: dict[str, Any], ids: set[str], tenants: set[str]) -> None:
    assert set(result) == {"requests", "summary", "decisions", "wall_seconds"}
    assert set(result["requests"]) == ids
    for rec in result["requests"].values():
        if rec["state"] == "rejected":  # SCENARIO.md: a rejected request carries `reason`
            assert set(rec) == REQUEST_RESULT_KEYS | {"reason", "tenant"}
            assert rec["reason"].strip()
        elif "waiting_for" in rec:  # still queued when the clock stopped: why it waits
            assert rec["state"] == "queued"
            assert set(rec) == REQUEST_RESULT_KEYS | {"waiting_for"}
            assert rec["waiting_for"]["kind"] in {"quota", "capacity", "fifo"}
            assert rec["waiting_for"]["message"].strip()
        else:
            assert set(rec) == REQUEST_RESULT_KEYS
        assert rec["state"] in {
            "queued",
            "admitted",
            "parked",
            "culled",
            "finished",
            "cancelled",
            "rejected",
            "preempted",
        }
    assert set(result["summary"]) >= SUMMARY_KEYS
    assert tenants <= set(result["summary"]["per_tenant"])
    for t in result["summary"]["per_tenant"].values():
        assert {"gpu_hours_allocated", "wait_p95", "wait_p50", "admitted", "rejected"} <= set(t)
    assert isinstance(result["decisions"], int)
    assert isinstance(result["wall_seconds"], float)


def test_main_json_output(
    tmp_path: Path, fake_driver: list[float | None], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, base_scenario())
    assert main(["simulate", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out)
    assert_result_shape(result, {"r1", "r2", "r3"}, {"vision", "nlp", "solo"})
    assert result["requests"]["r1"]["state"] == "finished"
    assert fake_driver == [7200.0]  # the scenario's own until


def test_main_until_overrides_the_scenario(
    tmp_path: Path, fake_driver: list[float | None], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, base_scenario())
    assert main(["simulate", str(path), "--json", "--until", "900"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert fake_driver == [900.0]
    assert result["requests"]["r1"]["state"] == "admitted"
    assert result["summary"]["end"] == 900.0


def test_main_events_file(
    tmp_path: Path, fake_driver: list[float | None], capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.jsonl"
    assert main(["simulate", str(write(tmp_path, base_scenario())), "--events", str(events)]) == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert lines[0] == {
        "t": 0.0,
        "event": "submit",
        "id": "r1",
        "tenant": "vision",
        "kind": "kernel",
        "gpus": 2,
    }
    assert [e["t"] for e in lines] == sorted(e["t"] for e in lines)
    assert len(lines) == 9


def test_main_human_table(
    tmp_path: Path, fake_driver: list[float | None], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", str(write(tmp_path, base_scenario()))]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("tenant"))
    for word in ("requests", "admitted", "rejected", "GPU-h alloc", "wait p50", "wait p95"):
        assert word in header
    for tenant in ("vision", "nlp", "solo"):
        assert any(line.startswith(tenant) for line in out.splitlines())
    assert "utilization" in out and "%" in out
    assert "capacity" in out


def test_main_without_a_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "simulate" in capsys.readouterr().out


# --- against the real driver -----------------------------------------------------------


@pytest.mark.slow
@needs_driver
@pytest.mark.parametrize("path", [*SCENARIOS, EXAMPLE], ids=lambda p: p.name)
def test_real_simulate_json_and_events(tmp_path: Path, path: Path) -> None:
    events = tmp_path / "events.jsonl"
    proc = simulate(path, "--json", "--events", events)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    scenario = load_scenario(path)
    assert_result_shape(result, {r.id for r in scenario.requests}, set(scenario.config.tenants))
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert len(lines) == result["decisions"]
    assert all({"t", "event"} <= set(e) for e in lines)


@needs_driver
@pytest.mark.slow
def test_real_example_table_and_until(tmp_path: Path) -> None:
    proc = simulate(EXAMPLE)
    assert proc.returncode == 0, proc.stderr
    for tenant in ("vision", "nlp", "students"):
        assert tenant in proc.stdout
    assert "utilization" in proc.stdout
    proc = simulate(EXAMPLE, "--json", "--until", "3000")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["summary"]["end"] <= 3000.0
    # Only what was submitted by t=3000 is in the result: a later request is not "queued".
    submits = {r.id: r.submit for r in load_scenario(str(EXAMPLE)).requests}
    arrived = {rid for rid, t in submits.items() if t <= 3000}
    assert 0 < len(arrived) < len(submits)  # the example has requests on both sides
    assert set(result["requests"]) == arrived
    s = result["summary"]
    assert s["requests"] == len(arrived) == s["admitted"] + s["rejected"] + s["never_admitted"]
    assert sum(t["requests"] for t in s["per_tenant"].values()) == len(arrived)
    queued = [rid for rid, r in result["requests"].items() if r["state"] == "queued"]
    assert all("waiting_for" in result["requests"][rid] for rid in queued)


@needs_driver
@pytest.mark.slow
def test_real_rejections_in_table_and_json() -> None:
    path = ROOT / "tests" / "scenarios" / "27-rejection-reasons.yaml"
    proc = simulate(path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    section = lines[lines.index("rejected") + 1 :]
    rows = {line.split()[0]: line for line in section if line.startswith("  ")}
    assert rows["no-tenant"].split()[1] == "ghost"
    assert rows["no-tenant"].endswith("unknown tenant 'ghost'")
    assert "do not fit on one node" in rows["too-wide"]
    result = json.loads(simulate(path, "--json").stdout)
    rejected = {k: v for k, v in result["requests"].items() if v["state"] == "rejected"}
    assert set(rejected) == {"too-wide", "over-nominal", "no-tenant", "no-flavor", "not-in-quota"}
    assert all(v["reason"] for v in rejected.values())
    assert rejected["no-flavor"]["reason"] == "unknown flavor 'v100'"


@needs_driver
@pytest.mark.slow
def test_real_csv_and_json_scenarios(tmp_path: Path) -> None:
    path = csv_scenario(
        tmp_path, 'r1,vision,ann,kernel,2,,,0,3600,"[[0,600]]",\nr2,nlp,bob,job,4,a100,,10,600,,\n'
    )
    proc = simulate(path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["requests"]) == {"r1", "r2"}
    doc = copy.deepcopy(base_scenario())
    jpath = tmp_path / "s.json"
    jpath.write_text(json.dumps(doc))
    proc = simulate(jpath, "--json")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["requests"]) == {"r1", "r2", "r3"}


# --- --set KEY=VALUE and waiting_for at --until ------------------------------------

FULL = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}},
    "tenants": {"vision": {"quota": {"a100": 4}}},
    "requests": [
        {"id": "a", "submit": 0, "tenant": "vision", "user": "a", "kind": "job", "gpus": 4,
         "duration": 100},
        {"id": "b", "submit": 0, "tenant": "vision", "user": "b", "kind": "job", "gpus": 2,
         "duration": 100},
    ],
}  # fmt: skip


@pytest.mark.slow
def test_cli_until_says_why_the_queued_wait(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    proc = simulate(path, "--json", "--until", "50")
    assert proc.returncode == 0, proc.stderr
    reqs = json.loads(proc.stdout)["requests"]
    assert "waiting_for" not in reqs["a"]  # admitted
    assert reqs["b"]["waiting_for"] == {"kind": "quota", "message": "vision uses all 4 of its a100"}
    # With more quota the node is what is short: the same request waits for capacity.
    proc = simulate(path, "--json", "--until", "50", "--set", "tenants.vision.quota.a100=8")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"]["b"]["waiting_for"] == {
        "kind": "capacity",
        "message": "no a100 node has 2 free GPUs",
    }
    # Run to the end: nothing is queued, nothing says why.
    done = json.loads(simulate(path, "--json").stdout)["requests"]
    assert all("waiting_for" not in r for r in done.values())


def test_cli_set_overrides_dotted_keys(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    proc = simulate(
        path, "--json", "--set", "tenants.vision.quota.a100=2", "--set", "policy.idle_timeout=1200"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # A quota of 2 cannot ever hold the 4-GPU request: rejected, as if the file said 2.
    assert result["requests"]["a"]["state"] == "rejected"
    assert result["requests"]["b"]["admitted_at"] == 0.0


@pytest.mark.parametrize(
    ("setting", "key", "words"),
    [
        ("tenants.vision.quota.a100=-1", "tenants.vision.quota.a100", "non-negative"),
        ("policy.idle_timeout=soon", "policy.idle_timeout", "number"),
        ("nope=1", "nope", "unknown key"),
        ("tenants.vision.quota.a100=[1, 2]", "tenants.vision.quota.a100", "single value"),
        ("tenants.vision.quota.a100.x=1", "tenants.vision.quota.a100.x", "not a mapping"),
        ("no-equals-sign", "--set", "KEY=VALUE"),
    ],
)
def test_cli_set_errors_name_the_key(tmp_path: Path, setting: str, key: str, words: str) -> None:
    proc = simulate(write(tmp_path, FULL), "--set", setting)
    assert_one_line_error(proc, key, words)


@needs_driver
@pytest.mark.slow
def test_a_replay_leaves_no_growing_reference_cycles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`simulate` runs with the cyclic garbage collector off (sim/cli.py). That is sound
    while what loading, replaying and reporting leave for a collection does not grow with
    the trace: the core's ledger holds one small cycle (~200 objects with what it
    reaches), but a cycle per request or decision would leave thousands more for a month
    of four times the traffic."""
    import gc

    from jupyter_gpuaas.sim.driver import run_scenario

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import month_trace

    def left_behind(n: int) -> int:
        out = tmp_path / str(n)
        out.mkdir()
        path = month_trace.generate(out, requests=n, seed=3)
        gc.collect()
        scenario = load_scenario(path)
        lines = io.StringIO()
        tally = Tally(scenario, lines)  # as `simulate` runs it
        sim = run_scenario(scenario, tally=tally)
        result = tally.result(sim.end, 0.0, sim.core.waiting_for)
        events = {json.loads(line)["event"] for line in lines.getvalue().splitlines()}
        assert {"cull", "expire", "cancel", "finish", "reject"} <= events, events
        assert result["summary"]["requests"] == n
        del scenario, sim, result, tally, lines
        return gc.collect()

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        assert left_behind(4000) - left_behind(1000) < 30
    finally:
        if was_enabled:
            gc.enable()


@needs_driver
@pytest.mark.parametrize("trace", ["month", "kueue-baseline"])
@pytest.mark.slow
def test_a_tally_fed_as_it_goes_reports_what_the_kept_decisions_do(
    tmp_path: Path, trace: str
) -> None:
    """`simulate` hands each batch of decisions to the report as they are made and keeps
    none (sim/report.py's Tally): its result and events file must be what a report over
    the whole kept stream gives, float sums and all. The two traces have every kind of
    event between them: culls, resumes, expiries and rejections in a month, preemptions
    in Kueue's baseline."""
    from jupyter_gpuaas.sim.driver import run_scenario

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import kueue_baseline
        import month_trace
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    if trace == "month":
        path = month_trace.generate(tmp_path, requests=3000, seed=5, preempt_interactive=True)
        kinds = {"admit", "cull", "resume", "expire", "reject", "cancel"}
    else:
        path = kueue_baseline.generate(tmp_path)
        kinds = {"admit", "preempt", "requeue", "finish"}
    scenario = load_scenario(path)
    kept = run_scenario(scenario)
    expected = build_result(scenario, kept.decisions, kept.end, 1.5, kept.core.waiting_for)
    assert {d.event for d in kept.decisions} >= kinds

    lines = io.StringIO()
    tally = Tally(scenario, lines)
    streamed = run_scenario(scenario, tally=tally)
    assert streamed.decisions == []  # nothing kept
    assert tally.result(streamed.end, 1.5, streamed.core.waiting_for) == expected
    assert lines.getvalue().splitlines() == [json.dumps(d.to_json()) for d in kept.decisions]


@needs_driver
def test_an_instant_s_events_play_in_the_order_they_were_pushed() -> None:
    """The driver files holders' events by time; events sharing an instant play in the
    order they were pushed, however many share it (Kueue's large shape finishes
    thousands at once), and one pushed for the instant while it plays (a busy interval
    starting where the last ended) plays within it."""
    from jupyter_gpuaas.sim.driver import run_scenario
    from jupyter_gpuaas.sim.scenario import parse_scenario

    jobs = [
        {"id": f"j{i}", "tenant": "t", "user": "u", "kind": "job", "gpus": 1}
        | {"submit": float(i % 7), "duration": 100.0 - i % 7}  # every one ends at 100
        for i in range(300)
    ]
    kernel = {"id": "k", "tenant": "t", "user": "u", "kind": "kernel", "gpus": 1}
    kernel |= {"submit": 0.0, "duration": 500.0, "busy": [[0, 40], [40, 60]]}
    doc = {
        "flavors": {"a100": {"nodes": 40, "gpus_per_node": 8}},
        "tenants": {"t": {"quota": {"a100": 320}}},
        "policy": {"idle_timeout": 1},
        "requests": [kernel, *jobs],
    }
    decisions = run_scenario(parse_scenario(doc)).decisions
    admitted = [d.id for d in decisions if d.event == "admit" and d.id != "k"]
    finished = [d.id for d in decisions if d.event == "finish" and d.t == 100.0]
    assert len(finished) == 300
    assert finished == admitted  # pushed at admission, in that order
    # Idle at 40 and busy again at 40, in that order: never culled (idle_timeout 1 s).
    assert [d.event for d in decisions if d.id == "k"][:2] == ["submit", "admit"]
    culls = [d.t for d in decisions if d.id == "k" and d.event == "cull"]
    assert culls == [61.0]
