"""Fixtures of the hub tests: one REAL JupyterHub per session (hubutil.py builds it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from hubutil import CHP, REPO, Hub


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    if not CHP.exists() and not shutil.which("configurable-http-proxy"):
        pytest.skip("configurable-http-proxy not installed: run `npm ci` (make test does)")
    h = Hub(tmp_path_factory.mktemp("hub"))
    h.start()
    try:
        yield h
    finally:
        h.stop()
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        shutil.copy(h.log_path, artifacts / "hub-tests-jupyterhub.log")


@pytest.fixture
def clean_hub(hub: Hub) -> Iterator[Hub]:
    """The session's hub, with no server running before and after the test."""
    hub.cleanup()
    yield hub
    hub.cleanup()
