"""Fixtures of the Kueue tests: the pinned Kueue's CRDs (read from the Go module cache,
never copied into the tree) and the quota files of every scenario."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kueue_objects import load_crds


@pytest.fixture(scope="session")
def crds() -> dict[tuple[str, str], dict[str, Any]]:
    return load_crds()
