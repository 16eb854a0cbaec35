"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def _refresh_compiled_core() -> None:
    """Never test a stale compiled core: rebuild it when a source changed since.

    The admission core may be compiled in place with mypyc (scripts/build_core.py, run by
    `make pytest`). Python imports a compiled module in preference to its .py file, so
    after an edit to jupyter_gpuaas/admission/core.py a plain `pytest` would otherwise
    test the old compiled code. This runs before any test module imports the core; when
    nothing changed it costs a hash of the sources (about a millisecond). Without
    compiled modules (pure mode, no compiler) there is nothing to refresh; with
    GPUAAS_PURE=1 the script removes them.
    """
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "build_core.py"
    spec = importlib.util.spec_from_file_location("_gpuaas_build_core", script)
    if not script.exists() or spec is None or spec.loader is None:
        return
    build_core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_core)
    pure_wanted = os.environ.get("GPUAAS_PURE", "") not in ("", "0")
    if not build_core.is_stale() and not (pure_wanted and build_core.compiled_files()):
        return
    loaded = [
        m for m in sys.modules if m.startswith(("jupyter_gpuaas.admission.", "jupyter_gpuaas.sim."))
    ]
    if loaded:  # too late for this process: it would keep the modules it has
        pytest.exit(f"the compiled admission core is stale and {loaded[0]} is already imported")
    subprocess.run([sys.executable, str(script)], check=False)


_refresh_compiled_core()


#: Fixtures that start something that takes seconds: the Kubernetes control plane
#: (tests/kubernetes/, about 40 s, then seconds a test), a JupyterHub, Chromium, PostgreSQL,
#: a gateway or Jupyter server as a process (jobs, server, faults and the gateway tests'
#: `spawn_gateway`), or pytest-jupyter's server with our extension.
SLOW_FIXTURES = frozenset(
    {
        "cluster",
        "hub",
        "clean_hub",
        "chromium_browser",
        "postgres_url",
        "own_postgres",
        "spawn_gateway",
        "tls_gateway",
        "spawn",
        "gateway",
        "server",
        "jp_serverapp",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that takes a fixture of SLOW_FIXTURES, or runs once on PostgreSQL (`db_url`
    parametrized), is `slow`, those written later included, so that `pytest -m "not slow"`
    (the fast part, under a minute) leaves every one of them out. In a pytest-xdist
    worker, the tests are also put in the order their work units go out (dispatch_order)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if names & SLOW_FIXTURES or params.get("db_url") == "postgres":
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # every worker sorts alike: the same collection
        items[:] = dispatch_order(items)


#: Directories whose tests run in ONE pytest-xdist worker together under `--dist loadfile`
#: (`make pytest`): tests/kubernetes shares one real control plane per session (starting
#: it costs 40-60 s, and two would hand out pod IPs from the same loopback range, where
#: KwokKubelet's processes listen).
WHOLE_DIRECTORY_SCOPES = ("tests/kubernetes/",)


def work_unit_of(nodeid: str) -> str:
    """What one xdist worker runs whole: a test's file (its module fixtures start once, in
    one worker), or its directory of WHOLE_DIRECTORY_SCOPES."""
    path = nodeid.split("::", 1)[0]
    for directory in WHOLE_DIRECTORY_SCOPES:
        if path.startswith(directory):
            return directory
    return path


def dispatch_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests by work unit (work_unit_of), the units in the order they are handed out:
    the longest first, so that no worker starts a long one when the others are done.
    tests/kubernetes (the longest: a control plane, then seconds a test); then every file
    of tests/hub and tests/ui (a Hub, browsers, a packaging build: a minute or more for a
    few tests); then the other directories' (processes, servers); then tests/*.py (mostly
    in-process); within each, the units with more tests first. A unit's tests keep their
    order."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(work_unit_of(item.nodeid), []).append(item)

    def rank(unit: str) -> tuple[int, int]:
        parts = unit.split("/")
        if unit in WHOLE_DIRECTORY_SCOPES:
            tier = 0
        elif len(parts) > 2 and parts[1] in ("hub", "ui"):
            tier = 1
        elif len(parts) > 2:
            tier = 2
        else:
            tier = 3
        return tier, -len(units[unit])

    return [item for unit in sorted(units, key=rank) for item in units[unit]]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, where it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with work_unit_of's units, handed out in the order the workers
    collected them (dispatch_order), not by their number of tests alone. (Not `--dist
    loadgroup` with `xdist_group` marks: on pytest 9.2 it silently stops grouping,
    pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(nodeid)

    return Scheduling(config, log)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real, empty PostgreSQL database for this test session (see tests/pg.py).

    Skips (with the reason) where the PostgreSQL binaries are missing;
    `scripts/ensure-system-deps.sh` installs them on Debian.
    """
    import os

    try:
        from pg import PostgresServer, PostgresUnavailable
    except ImportError:  # tests/ became a package
        from tests.pg import PostgresServer, PostgresUnavailable

    external = os.environ.get("GPUAAS_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    try:
        server = PostgresServer()
    except PostgresUnavailable as e:
        pytest.skip(str(e))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Any]:
    """One Chromium for a module's tests (a launch costs seconds); tests take `browser`.

    Not one for the session: Playwright's sync API holds an event loop of its own in this
    thread while its browser lives, and an asyncio test in a later module could not run
    its own (a module's tests are either the browser's or asyncio's)."""
    from helpers import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def browser(chromium_browser: Any) -> Iterator[Any]:
    """The session's Chromium (Playwright, helpers.chromium: skipped, saying why, where it
    is missing). Each person a test plays is a context of their own
    (`helpers.new_page(browser)`); every context the test opened is closed after it."""
    before = set(chromium_browser.contexts)
    yield chromium_browser
    for context in chromium_browser.contexts:
        if context not in before:
            context.close()


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One REAL JupyterHub (tests/hubutil.py) for every test of the session that takes it
    (tests/hub/, tests/ui/): JupyterHub starts slowly on a small machine. Its log is kept
    in test-artifacts/."""
    import os
    import shutil

    from hubutil import REPO, Hub

    h = Hub(tmp_path_factory.mktemp("hub"))
    try:
        with h.running():
            yield h
    finally:
        if h.log_path.exists():  # not where the test was skipped before the hub started
            artifacts = REPO / "test-artifacts"
            artifacts.mkdir(exist_ok=True)
            # One session Hub per xdist worker (gw0, gw1...): a log each.
            worker = os.environ.get("PYTEST_XDIST_WORKER")
            name = f"hub-tests-jupyterhub-{worker}.log" if worker else "hub-tests-jupyterhub.log"
            shutil.copy(h.log_path, artifacts / name)


@pytest.fixture
def clean_hub(hub: Any) -> Iterator[Any]:
    """The session's hub, with no server running before and after the test."""
    hub.cleanup()
    yield hub
    hub.cleanup()
