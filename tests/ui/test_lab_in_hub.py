"""The sidebar in the demo hub: alice logs in, her server opens JupyterLab, and the GPUs
panel shows her team's quota and the devices through her own server's proxy to the
Hub-managed gateway (the server's token, no gateway token in the browser).

The hub is the one tests/hub/ runs (hub_config/local/ on free ports, configurable-http-
proxy, simulated devices); the Galata suite (tests/ui/run_galata.py) covers the panel in
depth against a standalone gateway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import browser_page
from hubutil import Hub

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    if not (ROOT / "jupyter_gpuaas" / "labextension" / "package.json").exists():
        pytest.skip("the sidebar is not built: `make labextension` (make test does)")
    with Hub(tmp_path, extra_config='c.Spawner.default_url = "/lab"\n').running() as h:
        yield h


def test_the_gpus_panel_in_jupyterlab_behind_the_hub(hub: Hub) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    resp = hub.spawn("alice", {"tenant": "vision", "flavor": "a100", "gpus": 1})
    assert resp.status_code in (201, 202), resp.text
    hub.wait_ready("alice", timeout=90)
    shots = ROOT / "test-artifacts" / "ui"
    shots.mkdir(parents=True, exist_ok=True)
    with browser_page(1280, 900) as page:
        hub.log_in(page, "alice", "/user/alice/lab")
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
