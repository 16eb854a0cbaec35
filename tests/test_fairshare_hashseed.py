"""The fair-sharing tournament of a cohort tree decides the same way under every string
hash seed (issue 42; docs/KUEUE.md, "The hierarchical fair-sharing tournament").

The core once kept the better of each pair of heads in one scan over a dict: that relation
is not transitive in a tree, so which head was admitted followed the heads' order, and the
order followed PYTHONHASHSEED. Each run here is the real `simulate` in its own process,
with its own seed, on KUEUE.md's reproducer (scenario 84).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "tests" / "scenarios" / "84-tree-fair-sharing-bracket.yaml"
SEEDS = ("0", "1", "2", "3", "4", "5", "6", "7")


def admitted_at_one(seed: str) -> list[str]:
    """The requests `simulate --json` admits at t=1 when run with this hash seed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": seed}
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_gpuaas.cli", "simulate", "--json", str(SCENARIO)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        check=True,
    )
    result = json.loads(proc.stdout)
    return sorted(rid for rid, r in result["requests"].items() if r.get("admitted_at") == 1)


def test_one_answer_under_every_hash_seed() -> None:
    answers = {seed: admitted_at_one(seed) for seed in SEEDS}
    assert len({tuple(a) for a in answers.values()}) == 1, answers
    # Kueue's bracket: Y beats X at `team`, then c's Z beats `team` at `org`.
    assert answers["0"] == ["Z"], answers
