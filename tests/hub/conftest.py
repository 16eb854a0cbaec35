"""Fixtures of the hub tests: one REAL JupyterHub per session (tests/hubutil.py builds it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from hubutil import REPO, Hub


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    h = Hub(tmp_path_factory.mktemp("hub"))
    try:
        with h.running():
            yield h
    finally:
        if h.log_path.exists():  # not where the test was skipped before the hub started
            artifacts = REPO / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            shutil.copy(h.log_path, artifacts / "hub-tests-jupyterhub.log")


@pytest.fixture
def clean_hub(hub: Hub) -> Iterator[Hub]:
    """The session's hub, with no server running before and after the test."""
    hub.cleanup()
    yield hub
    hub.cleanup()
