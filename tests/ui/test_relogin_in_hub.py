"""Logging out and back in with three GPU notebooks open takes no GPU (issue 45, item 1).

A real JupyterHub (tests/hubutil.py: the demo's queued spawner, the Hub-managed gateway
on four simulated a100s, configurable-http-proxy) and Debian's Chromium. alice logs in,
starts a CPU server from the spawn form (GPUs only for GPU kernels) and opens three
notebooks on the "Python 3 (1 GPU)" kernelspec: JupyterLab starts their kernels, which
wait with no GPU request. She logs out through JupyterLab's own Log Out (the Hub's
/hub/logout) and logs back in; JupyterLab restores the three notebooks. Nothing is held or
queued at the gateway until she runs a cell; then exactly one GPU is taken.

Both of JupyterHub's behaviours on logout are run: its default (`shutdown_on_logout`
False) keeps her server, so the restored notebooks reconnect to the same three kernels;
with `shutdown_on_logout` the server stops, she starts it again from the spawn form, and
JupyterLab restores the layout it saved in her home and starts three new kernels.

At every step the sidebar is read in one go (one script in the page, so nothing changes
between the reads): the team quota card ("vision · a100": its count, its meter, its
legend), the rows under "My work" and the devices marked hers must agree, whatever moment
the sample catches; and once settled they match what the gateway says.

A Python test with Playwright rather than a Galata one: Galata drives one JupyterLab at a
fixed URL that it starts itself, not a Hub's login, logout and spawn form; the Galata suite
(labextension/ui-tests, tests/ui/run_galata.py) covers the same deferral across a page
reload against a standalone gateway.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from helpers import RUN_CELL, browser_page, notebook
from hubutil import QUOTAS, REPO, Hub

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts" / "ui"
NAMES = ("train.ipynb", "eval.ipynb", "plot.ipynb")
DEFERRED = "GPU kernel: takes a GPU when you run a cell"

# One script, one moment: the quota card of vision/a100 and everything it must agree with.
SIDEBAR_JS = """() => {
  const panel = document.querySelector('#jp-gpuaas-panel');
  if (!panel) return null;
  const card = [...panel.querySelectorAll('.jp-gpuaas-quota-row')].find(
    r => r.querySelector('.jp-gpuaas-title')?.textContent === 'vision · a100');
  const rows = [...panel.querySelectorAll('ul[aria-label="My GPU requests"] > li')];
  return {
    card: card ? {
      count: card.querySelector('.jp-gpuaas-count').textContent,
      meter: card.querySelector('[role=meter]').getAttribute('aria-valuenow'),
      legend: card.querySelector('.jp-gpuaas-legend').textContent,
    } : null,
    rows: rows.map(r => r.dataset.state),
    mine: panel.querySelectorAll('.jp-gpuaas-device[data-owner="mine"]').length,
    deferred: [...panel.querySelectorAll('.jp-gpuaas-deferred')].map(e => e.textContent),
    summary: panel.querySelector('.jp-gpuaas-work .jp-gpuaas-summary').textContent,
  };
}"""


@pytest.fixture(params=[False, True], ids=["server-kept", "shutdown-on-logout"])
def shutdown_on_logout(request: pytest.FixtureRequest) -> bool:
    """JupyterHub.shutdown_on_logout: False is JupyterHub's default."""
    return bool(request.param)


def lab_hub(tmp_path: Path, extra: str = "", quotas: str = QUOTAS) -> Hub:
    """A Hub (not started) whose servers run this checkout's sidebar, with
    `window.jupyterapp` for the test's commands; `extra` config, the `quotas` file."""
    build = REPO / "jupyter_gpuaas" / "labextension"
    if not (build / "package.json").exists():
        pytest.skip("the sidebar is not built: `make labextension` (make test does)")
    # This checkout's build of the sidebar, first on the servers' JUPYTER_PATH: the venv's
    # own labextensions entry may be another checkout's (a worktree shares the venv).
    data = tmp_path / "jupyter-data"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "jupyter-gpuaas").symlink_to(build)
    # window.jupyterapp: the test opens notebooks and runs a cell by JupyterLab's commands.
    config = tmp_path / "jupyter-config"
    config.mkdir()
    expose = {"LabApp": {"expose_app_in_browser": True}}
    (config / "jupyter_server_config.json").write_text(json.dumps(expose))
    extra += (
        f'c.Spawner.environment["JUPYTER_PATH"] = {str(data)!r}\n'
        f'c.Spawner.environment["JUPYTER_CONFIG_PATH"] = {str(config)!r}\n'
    )
    return Hub(tmp_path, extra_config=extra, quotas=quotas)


@pytest.fixture
def hub(shutdown_on_logout: bool, tmp_path: Path) -> Iterator[Hub]:
    extra = f"c.JupyterHub.shutdown_on_logout = {shutdown_on_logout}\n"
    with lab_hub(tmp_path, extra).running() as h:
        yield h


@pytest.fixture
def gpu_kernelspec(hub: Hub) -> None:
    """The demo's GPU kernelspec, where the spawned servers look (this venv's prefix)."""
    from jupyter_gpuaas.hub.demo import install_kernelspec

    install_kernelspec(hub.root / "quotas.yaml")
    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3-gpu" / "kernel.json"
    assert json.loads(spec.read_text())["metadata"]["kernel_provisioner"]["config"]["gpus"] == 1


def log_in_to_lab(hub: Hub, page: Any) -> None:
    """alice logs in and lands in JupyterLab, starting a CPU server from the spawn form
    when she has none; the layout JupyterLab saved is restored."""
    hub.log_in(page, "alice", quote("/user/alice/lab", safe=""))
    lab = re.compile(rf"{re.escape(hub.url)}/user/alice/lab.*")
    page.wait_for_url(re.compile(rf"{re.escape(hub.url)}/(user/alice/lab|hub/user/|hub/spawn).*"))
    if page.url.startswith(f"{hub.url}/hub/user/"):  # "not running": its Launch button
        page.click("#start")
    if not lab.match(page.url):
        page.wait_for_selector("#gpuaas-gpus")
        page.fill("#gpuaas-gpus", "0")  # a CPU server: GPUs only for GPU kernels
        page.click("#spawn_form button[type=submit]")
        page.wait_for_url(lab, timeout=90_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=90_000)
    page.wait_for_function("() => window.jupyterapp !== undefined")
    page.evaluate("() => window.jupyterapp.restored")
    panel = page.locator("#jp-gpuaas-panel")
    if not panel.is_visible():
        page.locator('.jp-SideBar [data-id="jp-gpuaas-panel"]').click()
    panel.wait_for()


def sidebar_settles(
    hub: Hub, page: Any, quota: int, admitted: int, deferred: list[str], step: str
) -> None:
    """Sample the sidebar until it shows `admitted` running kernels and the `deferred`
    notebooks' lines; every sample, settled or not, must agree with itself."""
    samples: list[Any] = []

    def settled() -> bool:
        s = page.evaluate(SIDEBAR_JS)
        samples.append(s)
        if s is None or s["card"] is None:
            return False  # the panel is still loading its first state
        running = s["rows"].count("admitted")
        waiting = s["rows"].count("queued")
        card = s["card"]
        assert card["count"] == f"{running} / {quota}", (step, s)
        assert card["meter"] == str(running), (step, s)
        assert card["legend"].endswith(f"waiting {waiting}"), (step, s)
        assert s["mine"] == running, (step, s)  # one GPU per kernel, shown as hers
        heading = f" · {running} running, {waiting} queued" if s["rows"] else ""
        assert s["summary"] == heading, (step, s)  # "My work · 1 running, 0 queued"
        return running == admitted and sorted(s["deferred"]) == sorted(deferred)

    try:
        hub.wait_for(settled, 60, f"the sidebar {step}")
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast sample: {samples[-1:]}") from None
    page.locator("#jp-gpuaas-panel").screenshot(path=str(ARTIFACTS / f"relogin-{step}.png"))


def kernels_of(hub: Hub, page: Any) -> dict[str, dict[str, Any]]:
    """The server's GPU kernel records (/gpuaas/kernels) of the open notebooks, by name."""
    base = f"{hub.url}/user/alice"
    sessions = page.request.get(f"{base}/api/sessions").json()
    by_kernel = {s["kernel"]["id"]: Path(s["path"]).name for s in sessions}
    records = page.request.get(f"{base}/gpuaas/kernels").json()
    return {
        by_kernel[k["kernel_id"]]: k
        for k in records
        if k["kernel_id"] in by_kernel and k["ended"] is None
    }


def all_deferred(hub: Hub, page: Any) -> dict[str, dict[str, Any]]:
    """The three notebooks' kernels, each waiting for a first run with no GPU request."""

    def deferred() -> dict[str, dict[str, Any]] | None:
        records = kernels_of(hub, page)
        ok = sorted(records) == sorted(NAMES) and all(
            k["state"] == "deferred" for k in records.values()
        )
        return records if ok else None

    records: dict[str, dict[str, Any]] = hub.wait_for(deferred, 60, "three deferred kernels")
    for k in records.values():
        assert k["request_id"] is None, k
        assert k["message"] == DEFERRED, k
    return records


def test_logging_out_and_in_with_three_gpu_notebooks_takes_no_gpu_until_a_cell_runs(
    hub: Hub, shutdown_on_logout: bool, gpu_kernelspec: None
) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    quota = hub.tenant("vision")["quota"]["a100"]
    home = hub.root / "state" / "home" / "alice"
    home.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(NAMES):
        (home / name).write_text(notebook(f"print(6 * {7 + i})"))
    lines = [f"{n} · {DEFERRED}" for n in NAMES]

    with browser_page(1280, 900) as page:
        log_in_to_lab(hub, page)
        sidebar_settles(hub, page, quota, 0, [], "empty")
        for name in NAMES:  # JupyterLab starts each notebook's GPU kernel
            page.evaluate(
                "(p) => window.jupyterapp.commands.execute('docmanager:open', {path: p})", name
            )
        before = all_deferred(hub, page)
        assert hub.requests_of("alice") == []  # a CPU server, three kernels: nothing asked
        sidebar_settles(hub, page, quota, 0, lines, "opened")

        # The layout is saved on her server before she leaves (JupyterLab saves it a moment
        # after a change); a new login restores it from there.
        def saved() -> bool:
            resp = page.request.get(f"{hub.url}/user/alice/lab/api/workspaces/default")
            text = json.dumps(resp.json()) if resp.ok else ""
            return all(f"notebook:{n}" in text for n in NAMES)

        hub.wait_for(saved, 30, "the workspace with the three notebooks saved")

        # JupyterLab's File > Log Out (the Hub's logout page), then the login page again.
        page.evaluate("() => { window.jupyterapp.commands.execute('hub:logout'); }")
        page.wait_for_url(re.compile(r".*/hub/(login|logout).*"))
        if shutdown_on_logout:
            hub.wait_stopped("alice", 60)  # the Hub stopped her server, kernels and all
        else:
            assert hub.server("alice") is not None  # kept: her kernels still run
        assert hub.requests_of("alice") == []

        log_in_to_lab(hub, page)
        after = all_deferred(hub, page)
        same = {n: before[n]["kernel_id"] == after[n]["kernel_id"] for n in NAMES}
        # Kept: the restored notebooks reconnect to their kernels; stopped: new ones start.
        assert set(same.values()) == {not shutdown_on_logout}, same
        assert hub.requests_of("alice") == []
        sidebar_settles(hub, page, quota, 0, lines, "logged-back-in")

        # A cell run in one notebook asks for one GPU, granted at once (3 of vision's 3 free).
        target = NAMES[1]
        page.evaluate(RUN_CELL, target)
        page.locator(".jp-OutputArea-output", has_text="48").first.wait_for(timeout=90_000)
        # Her only request ever (the gateway lists ended ones too): none was made and
        # dropped on the way.
        live = hub.requests_of("alice")
        assert [(r["kind"], r["state"]) for r in live] == [("kernel", "admitted")], live
        records = kernels_of(hub, page)
        assert records[target]["request_id"] == live[0]["id"]
        assert [records[n]["state"] for n in NAMES if n != target] == ["deferred", "deferred"]
        sidebar_settles(
            hub, page, quota, 1, [line for line in lines if not line.startswith(target)], "ran"
        )
