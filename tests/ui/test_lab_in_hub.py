"""The sidebar in the demo hub: alice logs in, her server opens JupyterLab, and the GPUs
panel shows her team's quota and the devices through her own server's proxy to the
Hub-managed gateway (the server's token, no gateway token in the browser).

The hub is the one tests/hub/ runs (hub_config/local/ on free ports, configurable-http-
proxy, simulated devices); the Galata suite (tests/ui/run_galata.py) covers the panel in
depth against a standalone gateway.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _hub_class() -> Any:
    # tests/hub/hubutil.py (and the tests/helpers.py it imports), found from here even when
    # this module runs alone: the full run puts tests/hub on the path, a lone run does not.
    for path in (ROOT / "tests", ROOT / "tests" / "hub"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    return importlib.import_module("hubutil")


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Any]:
    module = _hub_class()
    if not module.CHP.exists():
        pytest.skip("configurable-http-proxy not installed: run `npm ci` (make test does)")
    if not (ROOT / "jupyter_gpuaas" / "labextension" / "package.json").exists():
        pytest.skip("the sidebar is not built: `make labextension` (make test does)")
    h = module.Hub(tmp_path, extra_config='c.Spawner.default_url = "/lab"\n')
    h.start()
    try:
        yield h
    finally:
        h.stop()


def test_the_gpus_panel_in_jupyterlab_behind_the_hub(hub: Any) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("no /usr/bin/chromium: scripts/ensure-system-deps.sh installs it")
    sync_api = pytest.importorskip("playwright.sync_api")
    resp = hub.spawn("alice", {"tenant": "vision", "flavor": "a100", "gpus": 1})
    assert resp.status_code in (201, 202), resp.text
    hub.wait_ready("alice", timeout=90)
    shots = ROOT / "test-artifacts" / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{hub.url}/hub/login?next=/user/alice/lab")
            page.fill("input[name=username]", "alice")
            page.fill("input[name=password]", hub.password)
            page.click("input[type=submit], button[type=submit]")
            page.wait_for_url("**/user/alice/lab**")
            page.locator('.jp-SideBar [data-id="jp-gpuaas-panel"]').click()
            panel = page.locator("#jp-gpuaas-panel")
            sync_api.expect(panel).to_be_visible()
            # Her own server, admitted on one of the four simulated a100s: "mine".
            sync_api.expect(panel.locator(".jp-gpuaas-device")).to_have_count(4)
            sync_api.expect(panel.locator('.jp-gpuaas-device[data-owner="mine"]')).to_have_count(1)
            work = panel.get_by_role("region", name="My work")
            sync_api.expect(work.locator('li[data-state="admitted"]')).to_contain_text("GPU server")
            quota = panel.locator(".jp-gpuaas-quota-row", has_text="vision · a100")
            sync_api.expect(quota).to_contain_text("1 / 3")
            # The event stream is open (behind the Hub it needs JupyterLab's XSRF token).
            sync_api.expect(panel.locator(".jp-gpuaas-banner")).to_be_hidden()
            panel.screenshot(path=str(shots / "panel-in-hub.png"))
        finally:
            browser.close()
