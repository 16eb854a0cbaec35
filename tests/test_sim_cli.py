"""`jupyter-gpuaas simulate`: scenario parsing, the result object, and the CLI's contract.

Error paths run the real console script in a subprocess, because what matters is what a
user sees: exit 2, one stderr line naming the key, never a traceback. Result-shape tests
run in-process against a stand-in driver (so they do not depend on the core's decisions),
and again against the real driver when `jupyter_gpuaas.sim.driver` exists.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_gpuaas.admission.config import SpecError
from jupyter_gpuaas.admission.model import Decision
from jupyter_gpuaas.cli import main
from jupyter_gpuaas.sim.report import build_result, format_table, percentile
from jupyter_gpuaas.sim.scenario import (
    Scenario,
    ScenarioError,
    ScenarioRequest,
    load_scenario,
    parse_scenario,
)

ROOT = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).parent / "jupyter-gpuaas"
EXAMPLE = ROOT / "hub_config" / "examples" / "two-teams.yaml"
SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))


def _load_config_tests() -> types.ModuleType:
    """test_config.py's cases, loaded by path so this works whatever pytest's import mode."""
    spec = importlib.util.spec_from_file_location(
        "_gpuaas_test_config", Path(__file__).with_name("test_config.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_tc = _load_config_tests()
CONFIG_CASES: list[tuple[str, str, Any, str, str]] = _tc.CONFIG_CASES
DELETE = _tc.DELETE
mutate = _tc.mutate

try:
    import jupyter_gpuaas.sim.driver as real_driver  # noqa: F401

    HAVE_DRIVER = True
except ImportError:
    HAVE_DRIVER = False
needs_driver = pytest.mark.skipif(
    not HAVE_DRIVER, reason="jupyter_gpuaas.sim.driver is not written yet (another engineer's file)"
)


def base_scenario() -> dict[str, Any]:
    doc: dict[str, Any] = _tc.base_config()
    doc["until"] = 7200
    doc["requests"] = [
        {
            "id": "r1",
            "tenant": "vision",
            "user": "ann",
            "kind": "kernel",
            "gpus": 2,
            "submit": 0,
            "duration": 3600,
            "busy": [[0, 600], [1200, 1800]],
        },
        {
            "id": "r2",
            "tenant": "nlp",
            "user": "bob",
            "kind": "job",
            "gpus": 4,
            "flavor": "a100",
            "priority": 3,
            "submit": 10,
            "duration": 600,
            "cancel": 500,
        },
        {
            "id": "r3",
            "tenant": "solo",
            "user": "cy",
            "kind": "server",
            "gpus": 1,
            "submit": 20,
            "duration": 1000,
        },
    ]
    doc["expect"] = {"admitted": ["r1"]}
    return doc


def write(tmp_path: Path, doc: Any, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def simulate(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), "simulate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], key: str, words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"jupyter-gpuaas simulate: {key}: "), lines[0]
    assert words in lines[0]


# --- error paths, through the real console script ---------------------------------------

R = "requests"
# (test id, dotted path, new value, key named, words in the problem)
REQUEST_CASES: list[tuple[str, str, Any, str, str]] = [
    ("unknown-request-key", "0.colour", "red", "requests[0].colour", "unknown key"),
    ("missing-id", "0.id", DELETE, "requests[0].id", "is required"),
    ("duplicate-id", "2.id", "r1", "requests[2].id", "duplicate id 'r1'"),
    ("missing-user", "1.user", DELETE, "requests[1].user", "is required"),
    ("unknown-kind", "0.kind", "notebook", "requests[0].kind", "server, kernel, job"),
    ("zero-gpus", "0.gpus", 0, "requests[0].gpus", "must be a positive integer"),
    ("fractional-gpus", "0.gpus", 1.5, "requests[0].gpus", "must be a positive integer"),
    ("bool-gpus", "0.gpus", True, "requests[0].gpus", "must be a positive integer"),
    ("negative-submit", "1.submit", -1, "requests[1].submit", "must be a non-negative number"),
    ("string-duration", "1.duration", "1h", "requests[1].duration", "non-negative number"),
    ("fractional-priority", "1.priority", 1.5, "requests[1].priority", "must be an integer"),
    ("busy-overlap", "0.busy", [[0, 600], [300, 900]], "requests[0].busy[1]", "overlap"),
    ("busy-unsorted", "0.busy", [[600, 900], [0, 300]], "requests[0].busy[1]", "overlap"),
    ("busy-backwards", "0.busy", [[600, 300]], "requests[0].busy[0]", "runs backwards"),
    ("busy-negative", "0.busy", [[-5, 300]], "requests[0].busy[0]", "non-negative number"),
    ("busy-not-pairs", "0.busy", [[0, 1, 2]], "requests[0].busy[0]", "[start, end] pair"),
    ("busy-not-list", "0.busy", "all day", "requests[0].busy", "list of [start, end]"),
    ("cancel-before-submit", "1.cancel", 5, "requests[1].cancel", "before submit 10"),
]


def _request_doc(path: str, value: Any) -> dict[str, Any]:
    doc = base_scenario()
    index, rest = path.split(".", 1)
    doc[R][int(index)] = mutate(doc[R][int(index)], rest, value)
    return doc


@pytest.mark.parametrize(
    ("path", "value", "key", "words"),
    [c[1:] for c in CONFIG_CASES],
    ids=[c[0] for c in CONFIG_CASES],
)
def test_cli_config_error(tmp_path: Path, path: str, value: Any, key: str, words: str) -> None:
    assert_one_line_error(
        simulate(write(tmp_path, mutate(base_scenario(), path, value))), key, words
    )


@pytest.mark.parametrize(
    ("path", "value", "key", "words"),
    [c[1:] for c in REQUEST_CASES],
    ids=[c[0] for c in REQUEST_CASES],
)
def test_cli_request_error(tmp_path: Path, path: str, value: Any, key: str, words: str) -> None:
    assert_one_line_error(simulate(write(tmp_path, _request_doc(path, value))), key, words)


@pytest.mark.parametrize(
    ("path", "value", "key", "words"),
    [
        ("until", -1, "until", "non-negative number"),
        ("expect", ["r1"], "expect", "must be a mapping"),
        ("requests", {"r1": {}}, "requests", "must be a list"),
        ("requests_file", "trace.csv", "requests", "exactly one of requests or requests_file"),
        ("requests", DELETE, "requests", "exactly one of requests or requests_file"),
        ("requests", [["r1"]], "requests[0]", "must be a mapping"),
    ],
    ids=[
        "negative-until",
        "expect-list",
        "requests-mapping",
        "both-sources",
        "no-source",
        "request-not-mapping",
    ],
)
def test_cli_scenario_error(tmp_path: Path, path: str, value: Any, key: str, words: str) -> None:
    assert_one_line_error(
        simulate(write(tmp_path, mutate(base_scenario(), path, value))), key, words
    )


def test_cli_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert_one_line_error(simulate(missing), str(missing), "cannot read")


def test_cli_yaml_syntax_error_says_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("flavors:\n  a100: {nodes: 1, gpus_per_node: 4\ntenants: {}\n")
    proc = simulate(path)
    assert_one_line_error(proc, str(path), "invalid YAML at line")


def test_cli_duplicate_yaml_key(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("flavors: {}\ntenants: {}\nrequests: []\nflavors: {}\n")
    assert_one_line_error(simulate(path), str(path), "duplicate key 'flavors' at line 4")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "42\n"], ids=["empty", "list", "scalar"])
def test_cli_document_not_a_mapping(tmp_path: Path, text: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    assert_one_line_error(simulate(path), str(path), "must be a mapping")


def test_cli_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"flavors": {}, "tenants": {}, "requests": [}')
    proc = simulate(path)
    assert_one_line_error(proc, str(path), "line 1")


def test_cli_bad_until_option(tmp_path: Path) -> None:
    proc = simulate(write(tmp_path, base_scenario()), "--until", "-5")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "non-negative" in proc.stderr


def test_cli_unwritable_events_file(tmp_path: Path) -> None:
    events = tmp_path / "no-such-dir" / "events.jsonl"
    proc = simulate(write(tmp_path, base_scenario()), "--events", events)
    assert_one_line_error(proc, str(events), "cannot write")


# --- CSV traces ----------------------------------------------------------------------------

CSV_HEADER = "id,tenant,user,kind,gpus,flavor,priority,submit,duration,busy,cancel\n"


def _csv_scenario(tmp_path: Path, rows: str) -> Path:
    (tmp_path / "trace.csv").write_text(CSV_HEADER + rows)
    doc = base_scenario()
    del doc[R]
    doc["requests_file"] = "trace.csv"
    return write(tmp_path, doc)


def test_csv_requests_file(tmp_path: Path) -> None:
    path = _csv_scenario(
        tmp_path,
        'r1,vision,ann,kernel,2,,,0,3600,"[[0,600],[1200,1800]]",\n'
        "r2,nlp,bob,job,4,a100,3,10,600,,500\n"
        "\n"
        "r3,solo,cy,server,1,,,20.5,1000,,\n",
    )
    scenario = load_scenario(path)
    assert scenario.requests == (
        ScenarioRequest(
            "r1", "vision", "ann", "kernel", 2, 0.0, 3600.0, busy=((0.0, 600.0), (1200.0, 1800.0))
        ),
        ScenarioRequest(
            "r2", "nlp", "bob", "job", 4, 10.0, 600.0, flavor="a100", priority=3, cancel=500.0
        ),
        ScenarioRequest("r3", "solo", "cy", "server", 1, 20.5, 1000.0),
    )
    assert scenario.until == 7200.0
    assert scenario.name == "scenario"


def test_csv_relative_to_the_scenario_file(tmp_path: Path) -> None:
    path = _csv_scenario(tmp_path, "r1,vision,ann,job,1,,,0,10,,\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = simulate(path, "--until", "0", cwd=elsewhere) if HAVE_DRIVER else None
    assert len(load_scenario(path).requests) == 1
    if proc is not None:
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("rows", "key", "words"),
    [
        ("r1,vision,ann,job,two,,,0,10,,\n", "trace.csv:2.gpus", "must be a positive integer"),
        ('r1,vision,ann,job,1,,,0,10,"[[0,",\n', "trace.csv:2.busy", "must be JSON"),
        (
            "r1,vision,ann,job,1,,,0,10,,\nr1,nlp,bob,job,1,,,0,10,,\n",
            "trace.csv:3.id",
            "duplicate id 'r1'",
        ),
        ("r1,vision,ann,job,1,,,,10,,\n", "trace.csv:2.submit", "is required"),
        ("r1,vision,ann,job,1,,,0,10,,,extra\n", "trace.csv:2", "cells but the header"),
        ('r1,vision,ann,kernel,1,,,0,10,"[[5,1]]",\n', "trace.csv:2.busy[0]", "runs backwards"),
    ],
    ids=[
        "bad-int",
        "bad-busy-json",
        "duplicate",
        "missing-required",
        "too-many-cells",
        "busy-backwards",
    ],
)
def test_cli_csv_errors(tmp_path: Path, rows: str, key: str, words: str) -> None:
    assert_one_line_error(simulate(_csv_scenario(tmp_path, rows)), key, words)


def test_cli_csv_unknown_column_and_missing_file(tmp_path: Path) -> None:
    path = _csv_scenario(tmp_path, "")
    (tmp_path / "trace.csv").write_text("id,tenant,user,kind,gpus,submit,duration,colour\n")
    assert_one_line_error(simulate(path), "trace.csv:1.colour", "unknown column")
    (tmp_path / "trace.csv").unlink()
    assert_one_line_error(simulate(path), "requests_file", "cannot read 'trace.csv'")


def test_csv_loads_100k_rows(tmp_path: Path) -> None:
    # How long this takes is measured in benchmarks/, not asserted here (a timed test fails
    # on a loaded machine and proves nothing on a quiet one).
    rows = "".join(
        f'r{i},vision,u{i % 50},kernel,{1 + i % 4},,,{i * 3},600,"[[0,60],[120,300]]",\n'
        if i % 3 == 0
        else f"r{i},nlp,u{i % 50},job,1,a100,{i % 5},{i * 3},600,,\n"
        for i in range(100_000)
    )
    path = _csv_scenario(tmp_path, rows)
    scenario = load_scenario(path)
    assert len(scenario.requests) == 100_000
    first, second, last = scenario.requests[0], scenario.requests[1], scenario.requests[-1]
    assert (first.id, first.tenant, first.kind, first.gpus, first.submit) == (
        "r0",
        "vision",
        "kernel",
        1,
        0,
    )
    assert (second.tenant, second.kind, second.flavor, second.priority) == ("nlp", "job", "a100", 1)
    assert (last.id, last.submit) == ("r99999", 99_999 * 3)


# --- parsing details --------------------------------------------------------------------------


def test_json_scenario_file(tmp_path: Path) -> None:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(base_scenario()))
    scenario = load_scenario(path)
    assert [r.id for r in scenario.requests] == ["r1", "r2", "r3"]
    assert scenario.expect == {"admitted": ["r1"]}


def test_unknown_tenant_or_flavor_is_not_a_format_error() -> None:
    doc = base_scenario()
    doc[R][0]["tenant"] = "nobody"
    doc[R][1]["flavor"] = "h100"
    scenario = parse_scenario(doc)
    assert scenario.requests[0].tenant == "nobody"
    assert scenario.requests[1].flavor == "h100"


def test_empty_request_list_and_touching_busy_intervals() -> None:
    doc = base_scenario()
    doc[R] = []
    assert parse_scenario(doc).requests == ()
    doc = _request_doc("0.busy", [[0, 600], [600, 900]])
    assert parse_scenario(doc).requests[0].busy == ((0.0, 600.0), (600.0, 900.0))


def test_shared_scenarios_and_example_parse() -> None:
    for path in [*SCENARIOS, EXAMPLE]:
        scenario = load_scenario(path)
        assert scenario.config.flavors, path
    example = load_scenario(EXAMPLE)
    assert 30 <= len(example.requests) <= 60
    assert example.config.policy.autoscale
    assert any(r.busy for r in example.requests)


def test_scenario_error_is_a_spec_error() -> None:
    with pytest.raises(SpecError):
        parse_scenario({"flavors": {}, "tenants": {}, "requests": [], "x": 1})
    assert issubclass(ScenarioError, SpecError)


# --- the result object --------------------------------------------------------------------


def _scenario(requests: list[ScenarioRequest], **flavor_nodes: int) -> Scenario:
    doc = {
        "flavors": {name: {"nodes": n, "gpus_per_node": 4} for name, n in flavor_nodes.items()},
        "tenants": {"a": {"quota": {f: 8 for f in flavor_nodes}}, "b": {"quota": {}}},
        "requests": [],
    }
    base = parse_scenario(doc)
    return Scenario(config=base.config, requests=tuple(requests))


def _req(
    rid: str, tenant: str = "a", gpus: int = 2, submit: float = 0.0, **kw: Any
) -> ScenarioRequest:
    return ScenarioRequest(rid, tenant, "u", kw.pop("kind", "kernel"), gpus, submit, 3600.0, **kw)


def _admit(t: float, rid: str, gpus: int = 2, flavor: str = "a100") -> Decision:
    return Decision(
        t,
        "admit",
        rid,
        {
            "tenant": "a",
            "flavor": flavor,
            "gpus": gpus,
            "node": f"{flavor}-0",
            "devices": list(range(gpus)),
        },
    )


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 50) == 5.0
    assert percentile(values, 95) == 10.0
    assert percentile(values, 10) == 1.0
    assert percentile([], 50) == 0.0
    assert percentile([7.0], 95) == 7.0


def test_result_states_waits_and_gpu_hours() -> None:
    scenario = _scenario(
        [
            _req("k1", busy=((0.0, 1800.0),)),  # busy only in its first half hour
            _req("j1", kind="job", gpus=4, submit=100.0),  # preempted, requeued, finished
            _req("q1", submit=1000.0),  # never admitted
            _req("x1", tenant="b"),  # rejected
            _req("c1", submit=0.0),  # cancelled while queued
            _req("late", submit=99999.0),  # arrives after the end
        ],
        a100=2,
    )
    decisions = [
        Decision(0.0, "submit", "k1", {"tenant": "a", "kind": "kernel", "gpus": 2}),
        _admit(0.0, "k1"),
        Decision(0.0, "reject", "x1", {"reason": "no quota"}),
        _admit(200.0, "j1", gpus=4),
        Decision(600.0, "cancel", "c1"),
        Decision(1800.0, "preempt", "j1", {"by": "k9"}),
        Decision(1800.0, "requeue", "j1"),
        Decision(3600.0, "cull", "k1", {"parked": True}),
        Decision(3600.0, "resume", "k1", {"node": "a100-0", "devices": [0, 1]}),
        _admit(3600.0, "j1", gpus=4),
        Decision(5400.0, "cull", "k1", {"parked": False}),
        Decision(7200.0, "finish", "j1"),
    ]
    result = build_result(scenario, decisions, end=7200.0, wall_seconds=0.5)
    reqs = result["requests"]
    assert reqs["k1"] == {
        "state": "culled",
        "admitted_at": 0.0,
        "wait": 0.0,
        "flavor": "a100",
        "preemptions": 0,
        "culls": 2,
    }
    assert reqs["j1"]["state"] == "finished"
    assert reqs["j1"]["admitted_at"] == 200.0 and reqs["j1"]["preemptions"] == 1
    assert reqs["q1"] == {
        "state": "queued",
        "admitted_at": None,
        "wait": 6200.0,
        "flavor": None,
        "preemptions": 0,
        "culls": 0,
    }
    assert reqs["x1"]["state"] == "rejected" and reqs["x1"]["wait"] == 0.0
    assert reqs["c1"]["state"] == "cancelled" and reqs["c1"]["wait"] == 600.0
    assert reqs["late"]["state"] == "queued" and reqs["late"]["wait"] == 0.0

    s = result["summary"]
    assert (s["requests"], s["admitted"], s["rejected"], s["never_admitted"]) == (6, 2, 1, 3)
    # waits counted: k1 0, j1 100, q1 6200, c1 600 (x1 rejected, late never arrived)
    assert s["wait_p50"] == 100.0 and s["wait_p95"] == 6200.0 and s["wait_max"] == 6200.0
    # 2 nodes x 4 GPUs x 2 h
    assert s["gpu_hours_capacity"] == 16.0 and s["node_hours"] == 4.0
    # k1: 2 GPUs 0..5400 = 3 GPU-h; j1: 4 GPUs 200..1800 + 3600..7200
    assert s["gpu_hours_allocated"] == pytest.approx(3.0 + 4 * (1600 + 3600) / 3600, abs=1e-5)
    # k1 busy only 0..1800 (relative to its first admission); j1 has no busy: all of it
    assert s["gpu_hours_busy"] == pytest.approx(1.0 + 4 * (1600 + 3600) / 3600, abs=1e-5)
    assert s["gpu_hours_idle_allocated"] == pytest.approx(2.0, abs=1e-5)
    assert s["utilization"] == pytest.approx(s["gpu_hours_busy"] / 16.0, abs=1e-5)
    assert s["per_tenant"]["a"]["admitted"] == 2
    assert s["per_tenant"]["b"] == {
        "requests": 1,
        "admitted": 0,
        "rejected": 1,
        "gpu_hours_allocated": 0.0,
        "gpu_hours_busy": 0.0,
        "wait_p50": 0.0,
        "wait_p95": 0.0,
    }
    assert result["decisions"] == len(decisions)
    assert result["wall_seconds"] == 0.5


def test_rejections_carry_their_reason_in_json_and_table() -> None:
    scenario = _scenario([_req("k1"), _req("x1", tenant="b"), _req("x2", gpus=9)], a100=1)
    decisions = [
        _admit(0.0, "k1"),
        Decision(0.0, "reject", "x1", {"reason": "unknown tenant 'b'"}),
        Decision(0.0, "reject", "x2", {"reason": "9 GPUs do not fit on one node"}),
    ]
    result = build_result(scenario, decisions, end=100.0, wall_seconds=0.0)
    reqs = result["requests"]
    assert reqs["x1"]["reason"] == "unknown tenant 'b'" and reqs["x1"]["tenant"] == "b"
    assert reqs["x2"]["reason"] == "9 GPUs do not fit on one node"
    assert "reason" not in reqs["k1"]
    lines = format_table(result).splitlines()
    section = lines[lines.index("rejected") + 1 :]
    assert section[0].split() == ["x1", "b", "unknown", "tenant", "'b'"]
    assert section[1].split()[:2] == ["x2", "a"]
    assert section[1].endswith("9 GPUs do not fit on one node")
    none = format_table(build_result(scenario, decisions[:1], 100.0, 0.0)).splitlines()
    assert "rejected" not in none


def test_many_rejections_are_listed_up_to_a_limit() -> None:
    reqs = [_req(f"x{i}", tenant="b") for i in range(25)]
    decisions = [Decision(0.0, "reject", r.id, {"reason": "no such tenant"}) for r in reqs]
    result = build_result(_scenario(reqs, a100=1), decisions, end=10.0, wall_seconds=0.0)
    lines = format_table(result).splitlines()
    section = lines[lines.index("rejected") + 1 :]
    assert sum("no such tenant" in line for line in section) == 20
    assert "  … and 5 more (every reason is in --json)" in section


def test_result_parked_preempted_and_still_admitted() -> None:
    scenario = _scenario([_req("k1"), _req("s1", kind="server"), _req("p1")], a100=1)
    decisions = [
        _admit(0.0, "k1"),
        _admit(0.0, "s1"),
        _admit(0.0, "p1", gpus=0),
        Decision(100.0, "cull", "k1", {"parked": True}),
        Decision(200.0, "preempt", "p1", {"by": "x"}),
    ]
    reqs = build_result(scenario, decisions, end=1000.0, wall_seconds=0.0)["requests"]
    assert [reqs[r]["state"] for r in ("k1", "s1", "p1")] == ["parked", "admitted", "preempted"]
    decisions.append(Decision(300.0, "expire", "k1"))
    reqs = build_result(scenario, decisions, end=1000.0, wall_seconds=0.0)["requests"]
    assert reqs["k1"]["state"] == "culled"


def test_capacity_follows_node_events() -> None:
    scenario = _scenario([], a100=1)
    decisions = [
        Decision(0.0, "scale_up", None, {"flavor": "a100", "nodes": 2}),
        Decision(300.0, "node_ready", None, {"flavor": "a100", "node": "a100-1"}),
        Decision(300.0, "node_ready", None, {"flavor": "a100", "node": "a100-2"}),
        Decision(2100.0, "scale_down", None, {"flavor": "a100", "node": "a100-2"}),
    ]
    s = build_result(scenario, decisions, end=3900.0, wall_seconds=0.0)["summary"]
    # a100-0: 3900 s; a100-1: 3600 s; a100-2: 1800 s  -> 9300 node-seconds
    assert s["node_hours"] == pytest.approx(9300 / 3600, abs=1e-5)
    assert s["gpu_hours_capacity"] == pytest.approx(4 * 9300 / 3600, abs=1e-5)
    assert s["utilization"] == 0.0


def test_zero_capacity_means_zero_utilization() -> None:
    s = build_result(_scenario([], a100=0), [], end=0.0, wall_seconds=0.0)["summary"]
    assert s["utilization"] == 0.0 and s["gpu_hours_capacity"] == 0.0


@pytest.mark.slow
def test_report_of_a_large_run_counts_every_decision() -> None:
    # Its speed is measured in benchmarks/ (month_trace.py), not asserted here.
    n = 100_000
    requests = [
        _req(f"r{i}", submit=float(i), busy=((0.0, 60.0), (120.0, 300.0))) for i in range(n)
    ]
    scenario = _scenario(requests, a100=1000)
    decisions: list[Decision] = []
    for i in range(n):
        rid = f"r{i}"
        decisions += [
            Decision(float(i), "submit", rid, {"tenant": "a", "kind": "kernel", "gpus": 2}),
            _admit(float(i + 5), rid),
            Decision(float(i + 400), "cull", rid, {"parked": True}),
            Decision(float(i + 500), "resume", rid, {"node": "a100-0", "devices": [0, 1]}),
            Decision(float(i + 900), "requeue", rid),
            Decision(float(i + 950), "admit", rid, {"flavor": "a100", "gpus": 2}),
            Decision(float(i + 1000), "cull", rid, {"parked": False}),
            Decision(float(i + 1200), "admit", rid, {"flavor": "a100", "gpus": 2}),
            Decision(float(i + 1300), "cull", rid, {"parked": False}),
            Decision(float(i + 1400), "finish", rid),
        ]
    result = build_result(scenario, decisions, end=float(n + 2000), wall_seconds=0.0)
    table = format_table(result)
    assert result["decisions"] == 10 * n
    summary = result["summary"]
    assert (summary["requests"], summary["admitted"], summary["never_admitted"]) == (n, n, 0)
    assert f"requests     {n}: {n} admitted" in table


# --- the CLI with a stand-in driver -----------------------------------------------------


@dataclass
class _FakeRun:
    decisions: list[Decision]
    end: float


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float | None]]:
    """A stand-in `jupyter_gpuaas.sim.driver`: admits everything at submit on a100-0."""
    untils: list[float | None] = []

    def run_scenario(scenario: Scenario, until: float | None = None) -> _FakeRun:
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
def test_real_example_table_and_until(tmp_path: Path) -> None:
    proc = simulate(EXAMPLE)
    assert proc.returncode == 0, proc.stderr
    for tenant in ("vision", "nlp", "students"):
        assert tenant in proc.stdout
    assert "utilization" in proc.stdout
    proc = simulate(EXAMPLE, "--json", "--until", "3600")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["summary"]["end"] <= 3600.0
    assert result["requests"]["vis-job-5"]["state"] in {"rejected", "queued"}


@needs_driver
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
def test_real_csv_and_json_scenarios(tmp_path: Path) -> None:
    path = _csv_scenario(
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
        sim = run_scenario(scenario)
        result = build_result(scenario, sim.decisions, sim.end, 0.0, sim.core.waiting_for)
        events = {d.event for d in sim.decisions}
        assert {"cull", "expire", "cancel", "finish", "reject"} <= events, events
        assert result["summary"]["requests"] == n
        del scenario, sim, result
        return gc.collect()

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        assert left_behind(4000) - left_behind(1000) < 30
    finally:
        if was_enabled:
            gc.enable()
