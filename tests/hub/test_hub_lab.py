"""JupyterLab in a spawned server, in a real browser, through the real Hub (conftest.py).

alice logs in with the shared password, starts her server from the spawn form and lands
in JupyterLab at /user/alice/lab, where the launcher offers the demo's GPU kernelspec
("Python 3 (1 GPU)", installed as `jupyter-gpuaas demo` does). bob holds all of vision's
quota, so the notebook alice opens on the GPU kernel waits: the cell she runs says where
the kernel stands in the queue, and runs on the granted GPU once bob stops. The server
extension's page /user/alice/gpuaas/kernels opens in the same logged-in browser (the Hub's
OAuth cookie, no Forbidden), and a terminal of her server finds `jupyter-gpuaas` on PATH.
Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import new_page
from hubutil import REPO, Hub

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"

# A terminal of the server, through its REST API and websocket, from the logged-in page.
TERMINAL_JS = """async (command) => {
  const base = document.body.dataset.baseUrl || "/user/alice/";
  const xsrf = (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || "";
  const resp = await fetch(base + "api/terminals", {
    method: "POST", headers: {"X-XSRFToken": decodeURIComponent(xsrf)}});
  if (!resp.ok) return "HTTP " + resp.status;
  const name = (await resp.json()).name;
  const url = location.origin.replace(/^http/, "ws") + base + "terminals/websocket/" + name;
  return await new Promise((resolve) => {
    const ws = new WebSocket(url);
    let out = "";
    const done = setTimeout(() => { ws.close(); resolve(out); }, 20000);
    ws.onopen = () => ws.send(JSON.stringify(["stdin", command + "\\r"]));
    ws.onmessage = (ev) => {
      const [kind, text] = JSON.parse(ev.data);
      if (kind === "stdout") out += text;
      // The mark at the start of a line: the terminal's echo of the command holds it too,
      // and can arrive before the command's output.
      if (/\\nEND-OF-CHECK/.test(out)) { clearTimeout(done); ws.close(); resolve(out); }
    };
  });
}"""


@pytest.fixture(scope="module")
def gpu_kernelspec(hub: Hub) -> None:
    """The demo's GPU kernelspec, where the spawned servers look (this venv's prefix)."""
    from jupyter_gpuaas.hub.demo import install_kernelspec

    install_kernelspec(hub.root / "quotas.yaml")
    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3-gpu" / "kernel.json"
    assert json.loads(spec.read_text())["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpuaas",
        "config": {"gpus": 1, "flavor": "a100"},  # the flavor of the hub's quota file
    }


@pytest.fixture
def page(browser: Any) -> Any:
    return new_page(browser, 1280, 900)


def test_jupyterlab_with_the_gpu_kernel_its_wait_the_kernels_page_and_a_terminal(
    clean_hub: Hub, gpu_kernelspec: None, page: Any
) -> None:
    hub = clean_hub
    ARTIFACTS.mkdir(exist_ok=True)
    # bob holds all of vision's quota (3 a100), so alice's GPU kernel will queue.
    assert hub.spawn("bob", {"tenant": "vision", "gpus": 3}).status_code in (201, 202)
    hub.wait_ready("bob")

    hub.log_in(page, "alice")
    page.wait_for_url("**/hub/spawn**")
    page.fill("#gpuaas-gpus", "0")  # a CPU server: GPUs only for GPU kernels
    page.click("#spawn_form button[type=submit]")

    # JupyterLab, rendered: the launcher with the GPU kernelspec's tile.
    page.wait_for_url(re.compile(r".*/user/alice/lab.*"), timeout=90_000)
    gpu_tile = page.locator(".jp-LauncherCard[data-category='Notebook']").filter(
        has_text="Python 3 (1 GPU)"
    )
    gpu_tile.wait_for(timeout=90_000)
    page.screenshot(path=str(ARTIFACTS / "hub-lab-launcher.png"))

    # A notebook on the GPU kernel: the cell run while it waits says why.
    gpu_tile.click()
    # A notebook's GPU kernel asks for its GPU when a cell runs: its websocket opens at
    # once and says "idle" (where JupyterLab alone would say "Connecting"), and the status
    # bar says what a run will do. (A cell run before the notebook has its kernel session
    # is not run at all: JupyterLab's own rule.)
    page.locator("#jp-main-statusbar").filter(has_text="Python 3 (1 GPU) | Idle").wait_for()
    page.locator(".jp-gpuaas-status").filter(
        has_text="GPU kernel: takes a GPU when you run a cell"
    ).wait_for()
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.wait_for()
    editor.click()
    page.keyboard.type("import os; print('devices', os.environ.get('CUDA_VISIBLE_DEVICES'))")
    page.keyboard.press("Shift+Enter")
    output = page.locator(".jp-Notebook .jp-Cell .jp-OutputArea-output").first
    try:
        output.filter(has_text="waiting for 1 a100 (position 1 in vision) …").wait_for()
    finally:
        page.screenshot(path=str(ARTIFACTS / "hub-lab-gpu-kernel-waiting.png"))

    # bob stops: alice's kernel gets a GPU and the cell runs on it.
    hub.stop_server("bob")
    ran = page.locator(".jp-Notebook .jp-Cell .jp-OutputArea-output").filter(
        has_text=re.compile(r"devices \d")
    )
    ran.first.wait_for(timeout=90_000)
    text = page.locator(".jp-Notebook .jp-Cell .jp-OutputArea").first.inner_text()
    assert "waiting for" not in text, text
    device = re.search(r"devices (\d)", text)
    assert device is not None
    page.screenshot(path=str(ARTIFACTS / "hub-lab-gpu-kernel-running.png"))

    # The terminal knows jupyter-gpuaas.
    out = page.evaluate(TERMINAL_JS, "command -v jupyter-gpuaas; echo END-OF-CHECK")
    assert re.search(r"/\S+/bin/jupyter-gpuaas", out), out

    # The extension's page, in the same browser: logged in through the Hub, not 403.
    resp = page.goto(f"{hub.url}/user/alice/gpuaas/kernels")
    assert resp is not None and resp.status == 200
    body = page.inner_text("body")
    assert "Forbidden" not in body
    assert f"running on 1 a100: device {device.group(1)} of a100-0" in body
    page.screenshot(path=str(ARTIFACTS / "hub-gpuaas-kernels-page.png"), full_page=True)

    # A browser logged in to the Hub only, straight to the page: the server's login
    # (the Hub's OAuth) takes it there, where this page used to answer Forbidden.
    fresh = page.context.browser.new_context()
    try:
        other = fresh.new_page()
        hub.log_in(other, "alice", "%2Fhub%2Fhome")
        other.wait_for_url("**/hub/home**")
        resp = other.goto(f"{hub.url}/user/alice/gpuaas/kernels")
        assert resp is not None and resp.status == 200
        assert other.url == f"{hub.url}/user/alice/gpuaas/kernels"
        assert "running on 1 a100" in other.inner_text("body")
    finally:
        fresh.close()

    # Stopping the server (the Hub's SIGINT) gives the kernel's GPU back at once.
    (kernel,) = [
        r for r in hub.requests_of("alice") if r["kind"] == "kernel" and r["state"] == "admitted"
    ]
    hub.stop_server("alice")
    hub.wait_stopped("alice")
    hub.wait_for(
        lambda: (
            kernel["id"]
            not in {r["id"] for r in hub.requests_of("alice") if r["state"] == "admitted"}
        ),
        15,
        "the kernel's grant released by the stopping server",
    )
