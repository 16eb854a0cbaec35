"""`advise`: evidenced advice, never on too few grants (pure parts; the store-backed CLI is
tested in tests/gateway/test_history_export.py); and a bad argument of `advise` is one
sentence naming the flag, exit 2, through the real command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpuaas.gateway.advice import move_quota_advice, smaller_gpu_advice

PERIOD = (1_700_000_000.0, 1_702_592_000.0)


def grant(user: str, peak: float | None, kind: str = "kernel") -> dict[str, Any]:
    return {
        "user": user,
        "tenant": "vision",
        "kind": kind,
        "flavor": None,
        "assigned_flavor": "a100",
        "first_admit": 1.0,
        "peak_utilization": peak,
    }


def test_a_user_whose_grants_peak_low_is_told_with_the_evidence() -> None:
    rows = [grant("alice", 0.1)] * 9 + [grant("alice", 0.9)]  # 9 of 10 low: p90 is low
    rows += [grant("bob", 0.1)] * 8 + [grant("bob", 0.8)] * 2  # p90 high: no advice
    rows += [grant("carol", 0.05)] * 9  # too few grants
    rows += [grant("dan", None)] * 20  # no utilization reported
    (advice,) = smaller_gpu_advice(rows, min_grants=10, low_utilization=0.3, period=PERIOD)
    assert advice.kind == "smaller_gpu" and advice.subject == "alice"
    assert advice.sentence.startswith(
        "alice's kernels on a100 peaked at 10% GPU utilization or less in 9 of 10 grants "
        "(2023-11-14 to 2023-12-14)"
    )
    assert advice.evidence["grants"] == 10 and advice.evidence["p90_peak_utilization"] == 0.1
    assert smaller_gpu_advice(rows, min_grants=11, low_utilization=0.3, period=PERIOD) == []


def scenario(nlp_jobs: int) -> dict[str, Any]:
    # nlp owns 4 a100 and never uses more than 1; vision owns 1 and queues 12 one-hour
    # jobs behind it. No cohort: vision cannot borrow nlp's idle GPUs.
    reqs = [
        {
            "id": f"v{i}",
            "tenant": "vision",
            "user": "alice",
            "kind": "job",
            "gpus": 1,
            "submit": 0,
            "duration": 3600,
        }
        for i in range(12)
    ]
    reqs += [
        {
            "id": f"n{i}",
            "tenant": "nlp",
            "user": "bob",
            "kind": "job",
            "gpus": 1,
            "submit": i * 3600,
            "duration": 3000,
        }
        for i in range(nlp_jobs)
    ]
    return {
        "flavors": {"a100": {"nodes": 1, "gpus_per_node": 5}},
        "tenants": {"vision": {"quota": {"a100": 1}}, "nlp": {"quota": {"a100": 4}}},
        "requests": reqs,
    }


def test_idle_quota_is_moved_in_a_what_if_replayed_on_the_history() -> None:
    (advice,) = move_quota_advice(scenario(12), min_grants=10, min_wait=300, period=PERIOD)
    assert advice.kind == "move_quota" and advice.subject == "nlp"
    ev = advice.evidence
    assert (ev["quota"], ev["p95_in_use"], ev["move"], ev["to"]) == (4, 1, 3, "vision")
    assert ev["what_if"]["set"] == ["tenants.nlp.quota.a100=1", "tenants.vision.quota.a100=4"]
    # 12 jobs on 1 GPU: the last waits 11 h; on 4 GPUs, 2 h.
    assert ev["wait_p95"]["vision"]["a"] == 11 * 3600 and ev["wait_p95"]["vision"]["b"] == 7200
    assert ev["wait_p95"]["nlp"]["b"] == 0
    assert advice.sentence == (
        "nlp's a100 quota of 4 peaked at 1 in use (p95, 2023-11-14 to 2023-12-14): moving 3 "
        "of it to vision would cut vision's p95 wait from 11 h to 2 h, and nlp's would go "
        "from 0 s to 0 s (a replay of 24 requests)."
    )
    # Fewer grants of nlp than the minimum: no advice.
    assert move_quota_advice(scenario(5), min_grants=10, min_wait=300, period=PERIOD) == []


# (flag named, the arguments, words of the sentence): each answered before the store is read.
BAD_ARGUMENTS = [
    ("--min-grants", ["--min-grants", "0"], "must be a whole number of at least 1, not '0'"),
    ("--min-grants", ["--min-grants=-3"], "at least 1, not '-3'"),
    ("--min-grants", ["--min-grants", "abc"], "whole number of at least 1, not 'abc'"),
    ("--min-grants", ["--min-grants", "1.5"], "whole number of at least 1, not '1.5'"),
    ("--low-utilization", ["--low-utilization", "2"], "from 0 to 1, not '2'"),
    ("--low-utilization", ["--low-utilization=-0.1"], "from 0 to 1, not '-0.1'"),
    ("--low-utilization", ["--low-utilization", "nan"], "from 0 to 1, not 'nan'"),
    ("--low-utilization", ["--low-utilization", "half"], "from 0 to 1, not 'half'"),
    ("--since", ["--since", "0"], "longer than 0, not '0'"),
    ("--since", ["--since=-5d"], "not a length of time: '-5d'"),
    ("--since", ["--since", "soon"], "not a length of time: 'soon'"),
    ("--quotas", ["--quotas", "/nonexistent/quotas.yaml"], "cannot read"),
    ("--db-url", ["--db-url", "not a url"], "cannot read the store"),
]


@pytest.mark.parametrize(
    ("flag", "argv", "words"), BAD_ARGUMENTS, ids=[" ".join(c[1]) for c in BAD_ARGUMENTS]
)
@pytest.mark.slow
def test_a_bad_argument_is_one_sentence_naming_the_flag(
    flag: str, argv: list[str], words: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("flavors: {a100: {nodes: 1, gpus_per_node: 4}}\ntenants: {}\n")
    store = f"sqlite:///{tmp_path / 'gpuaas.sqlite'}"
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpuaas.cli", "advise", "--db-url", store,
         "--quotas", str(quotas), *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert done.stdout == "" and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"jupyter-gpuaas advise: {flag}"), line
    assert words in line, line
    if flag != "--db-url":  # refused before the store is opened: no file made for it
        assert not (tmp_path / "gpuaas.sqlite").exists()
