"""`jupyter-gpuaas simulate`: scenario parsing, and the one-line errors of the CLI.

Error paths run the real console script in a subprocess, because what matters is what a
user sees: exit 2, one stderr line naming the key, never a traceback. CSV traces and the
finer points of parsing are read in-process (load_scenario, parse_scenario). The shared
scenario and the subprocess runner are in simutil.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from simutil import (
    CONFIG_CASES,
    DELETE,
    EXAMPLE,
    HAVE_DRIVER,
    SCENARIOS,
    R,
    assert_one_line_error,
    base_scenario,
    csv_scenario,
    mutate,
    simulate,
    write,
)

from jupyter_gpuaas.admission.config import SpecError
from jupyter_gpuaas.sim.scenario import (
    ScenarioError,
    ScenarioRequest,
    load_scenario,
    parse_scenario,
)

# --- error paths, through the real console script ---------------------------------------

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
@pytest.mark.slow
def test_cli_config_error(tmp_path: Path, path: str, value: Any, key: str, words: str) -> None:
    assert_one_line_error(
        simulate(write(tmp_path, mutate(base_scenario(), path, value))), key, words
    )


@pytest.mark.parametrize(
    ("path", "value", "key", "words"),
    [c[1:] for c in REQUEST_CASES],
    ids=[c[0] for c in REQUEST_CASES],
)
@pytest.mark.slow
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


@pytest.mark.slow
def test_cli_unwritable_events_file(tmp_path: Path) -> None:
    events = tmp_path / "no-such-dir" / "events.jsonl"
    proc = simulate(write(tmp_path, base_scenario()), "--events", events)
    assert_one_line_error(proc, str(events), "cannot write")


# --- CSV traces ----------------------------------------------------------------------------


def test_csv_requests_file(tmp_path: Path) -> None:
    path = csv_scenario(
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


@pytest.mark.slow
def test_csv_relative_to_the_scenario_file(tmp_path: Path) -> None:
    path = csv_scenario(tmp_path, "r1,vision,ann,job,1,,,0,10,,\n")
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
    assert_one_line_error(simulate(csv_scenario(tmp_path, rows)), key, words)


@pytest.mark.slow
def test_cli_csv_unknown_column_and_missing_file(tmp_path: Path) -> None:
    path = csv_scenario(tmp_path, "")
    (tmp_path / "trace.csv").write_text("id,tenant,user,kind,gpus,submit,duration,colour\n")
    assert_one_line_error(simulate(path), "trace.csv:1.colour", "unknown column")
    (tmp_path / "trace.csv").unlink()
    assert_one_line_error(simulate(path), "requests_file", "cannot read 'trace.csv'")


@pytest.mark.slow
def test_csv_loads_100k_rows(tmp_path: Path) -> None:
    # How long this takes is measured in benchmarks/, not asserted here (a timed test fails
    # on a loaded machine and proves nothing on a quiet one).
    rows = "".join(
        f'r{i},vision,u{i % 50},kernel,{1 + i % 4},,,{i * 3},600,"[[0,60],[120,300]]",\n'
        if i % 3 == 0
        else f"r{i},nlp,u{i % 50},job,1,a100,{i % 5},{i * 3},600,,\n"
        for i in range(100_000)
    )
    path = csv_scenario(tmp_path, rows)
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
