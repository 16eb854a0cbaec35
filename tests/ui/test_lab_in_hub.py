"""The sidebar in the demo hub: alice logs in, her server opens JupyterLab, and the GPUs
panel shows her team's quota and the devices through her own server's proxy to the
Hub-managed gateway (the server's token, no gateway token in the browser).

The hub is the session's, the one tests/hub/ runs (tests/conftest.py: hub_config/local/ on
free ports, configurable-http-proxy, simulated devices); the Galata suite
(tests/ui/run_galata.py) covers the panel in depth against a standalone gateway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from helpers import new_page
from hubutil import Hub

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpus_panel_in_jupyterlab_behind_the_hub(clean_hub: Hub, browser: Any) -> None:
    if not (ROOT / "jupyter_gpuaas" / "labextension" / "package.json").exists():
        pytest.skip("the sidebar is not built: `make labextension` (make test does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    hub = clean_hub
    resp = hub.spawn("alice", {"tenant": "vision", "flavor": "a100", "gpus": 1})
    assert resp.status_code in (201, 202), resp.text
    hub.wait_ready("alice", timeout=90)
    shots = ROOT / "test-artifacts" / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    page = new_page(browser, 1280, 900)
    # `?reset`: an empty layout, not the one an earlier test of this hub left in alice's
    # workspace (its notebooks restored, a kernel dialog over the page: a fresh-clone run
    # met one, "<dialog class=jp-Dialog> intercepts pointer events").
    hub.log_in(page, "alice", quote("/user/alice/lab?reset", safe=""))
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
