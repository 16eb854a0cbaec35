"""The README's `--fast-idle` tour, walked in Chromium: warning, Keep, cull, resume (issue 45,
Deliver 2).

The Hub is the demo's own configuration (tests/hubutil.py loads
hub_config/local/jupyterhub_config.py) with the quota file `jupyter-gpuaas demo --fast-idle`
writes (`demo.fast_idle` of the shipped quotas.yaml: warned after 30 s idle, culled after
60 s, parked 5 min), on four simulated a100s. Not the `demo` command itself: its start and
stop are tests/hub/test_demo_lifecycle.py's, and its servers report busy or idle every
30 s, which would make this walk a minute longer for nothing the tour shows; here the test
hub's servers report every second.

alice logs in, starts a CPU server from the spawn form and opens a notebook on the
"Python 3 (1 GPU)" kernel, which takes no GPU until she runs a cell (step 1 of the tour in
docs/tutorials/demo.md). Then, reading the page at each step:

2. she leaves it idle: a notification names the notebook and asks "Keep it?", and the
   sidebar's row says when it will be shut down, with a Keep button;
3. she presses the notification's Keep: the row says kept, and past the time it would have
   been culled at, the kernel still holds its GPU;
4. she leaves it idle again and ignores the new warning: the kernel is culled, a
   notification and the row say so in words, and its quota stays parked (the team's card
   says "parked 1"; no device is hers); the parked card keeps its title, and its badge
   stays inside it at the sidebar's default width, in the light and the dark theme;
5. she starts the notebook's kernel again and runs the cell: it gets a GPU at once from
   the parked reservation, whose row ends as "resumed by a new request".

The wall time of the whole walk is printed (and written to test-artifacts/ui/), not
asserted: timing belongs in benchmarks.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import RUN_CELL, new_page, notebook
from hubutil import REPO, Hub
from test_relogin_in_hub import (
    ARTIFACTS,
    DEFERRED,
    kernels_of,
    lab_hub,
    log_in_to_lab,
    sidebar_settles,
)

from jupyter_gpuaas.hub.demo import FAST_IDLE, fast_idle, install_kernelspec

pytestmark = pytest.mark.slow

NAME = "fast.ipynb"
CELL = 'import os; print("GPU", os.environ.get("CUDA_VISIBLE_DEVICES"))'


@pytest.fixture(scope="module")
def fast_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    shipped = (REPO / "hub_config" / "local" / "quotas.yaml").read_text(encoding="utf-8")
    root = tmp_path_factory.mktemp("fast-idle-hub")
    with lab_hub(root, quotas=fast_idle(shipped)).running() as hub:
        install_kernelspec(hub.root / "quotas.yaml")  # the demo's GPU kernelspec
        spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3-gpu" / "kernel.json"
        assert json.loads(spec.read_text())["metadata"]["kernel_provisioner"]["config"]["gpus"] == 1
        yield hub


def run_cell(page: Any) -> None:
    """Run the notebook's cell (JupyterLab's own command, as Shift+Enter)."""
    page.evaluate(RUN_CELL, NAME)


def toast(page: Any, text: str) -> Any:
    return page.locator(".Toastify__toast", has_text=text)


def test_the_fast_idle_tour_warning_keep_cull_resume(fast_hub: Hub, browser: Any) -> None:
    hub = fast_hub
    started = time.monotonic()
    marks: dict[str, float] = {}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tenant = hub.tenant("vision")
    assert tenant["idle_timeout"] == FAST_IDLE["idle_timeout"], tenant
    quota = tenant["quota"]["a100"]
    home = hub.root / "state" / "home" / "alice"
    home.mkdir(parents=True, exist_ok=True)
    (home / NAME).write_text(notebook(CELL))
    page = new_page(browser, 1280, 900, timeout_ms=90_000)
    panel = page.locator("#jp-gpuaas-panel")

    def shot(step: str) -> None:
        panel.screenshot(path=str(ARTIFACTS / f"fast-idle-{step}.png"))

    # 1. A CPU server, the notebook open on the GPU kernel: nothing held until a cell runs.
    log_in_to_lab(hub, page)
    page.evaluate("(p) => window.jupyterapp.commands.execute('docmanager:open', {path: p})", NAME)
    hub.wait_for(
        lambda: kernels_of(hub, page).get(NAME, {}).get("state") == "deferred",
        60,
        "the notebook's GPU kernel, waiting for a first run",
    )
    assert hub.requests_of("alice") == []
    sidebar_settles(hub, page, quota, 0, [f"{NAME} · {DEFERRED}"], "fast-idle-opened")
    run_cell(page)
    page.locator(".jp-OutputArea-output", has_text=re.compile(r"GPU \d")).first.wait_for()
    (first,) = hub.requests_of("alice")
    assert (first["kind"], first["state"]) == ("kernel", "admitted"), first
    rid = first["id"]
    row = panel.locator(f'.jp-gpuaas-work li[data-key="{rid}"]')
    assert row.get_attribute("data-state") == "admitted"
    sidebar_settles(hub, page, quota, 1, [], "fast-idle-ran")
    marks["GPU granted"] = time.monotonic() - started

    # 2. Idle: the warning, as a notification naming the notebook, and in its row.
    warned = toast(page, "Keep it?")
    warned.wait_for(timeout=FAST_IDLE["idle_timeout"] * 1000 + 30_000)
    marks["first warning"] = time.monotonic() - started
    said = warned.inner_text()
    assert f"Your GPU kernel {NAME} is idle on its GPU and will be shut down in" in said, said
    warning = row.locator(".jp-gpuaas-warning")
    assert "it will be shut down in" in warning.inner_text()
    assert row.get_by_role("button", name=re.compile("Keep the GPU")).count() == 1
    first_cull = float(kernels_of(hub, page)[NAME]["warning"]["cull_at"])
    shot("warned")

    # 3. Keep, from the notification: kept, and no cull at the time it was due.
    warned.get_by_role("button", name="Keep").click()
    # (The row is redrawn as its countdown moves: read anew each time, never held.)
    kept = "Kept: its idle clock started again."
    hub.wait_for(lambda: warning.inner_text() == kept, 30, "the row to say it was kept")
    warned.wait_for(state="detached")
    shot("kept")
    time.sleep(max(0.0, first_cull + 3 - time.time()))
    assert [r["state"] for r in hub.requests_of("alice")] == ["admitted"]
    assert row.get_attribute("data-state") == "admitted"
    marks["past the first cull time, kept"] = time.monotonic() - started

    # 4. Idle again, the new warning ignored: culled, said in words; its quota parked.
    again = toast(page, "Keep it?")
    again.wait_for(timeout=FAST_IDLE["idle_timeout"] * 1000 + 30_000)
    second_cull = float(kernels_of(hub, page)[NAME]["warning"]["cull_at"])
    assert second_cull > first_cull + 5, (first_cull, second_cull)
    culled = toast(page, f"Your GPU kernel {NAME} was idle and gave back its GPU.")
    culled.wait_for(timeout=FAST_IDLE["cull_warning"] * 1000 + 30_000)
    marks["culled"] = time.monotonic() - started
    hub.wait_for(
        lambda: row.get_attribute("data-state") == "parked", 30, "the row to say it is parked"
    )
    said = row.inner_text()
    assert "Stopped: it was idle on its GPU." in said, said
    assert "Its quota is kept for a while" in said, said
    assert not re.search(r"\br-[0-9a-f]{8,}|HTTP\s*\d{3}", said), said
    # The parked card keeps its title, and its badge fits inside the card at the
    # sidebar's default width (issue 45: a long badge once ran past the card's edge).
    title, badge = row.locator(".jp-gpuaas-title").first, row.locator(".jp-gpuaas-badge")
    assert NAME in title.inner_text() and badge.inner_text() == "parked"

    def card_fits(theme: str) -> None:
        card_box, title_box, badge_box = (
            row.bounding_box(),
            title.bounding_box(),
            badge.bounding_box(),
        )
        assert title_box["width"] > 40, (theme, title_box)
        right = card_box["x"] + card_box["width"]
        assert badge_box["x"] + badge_box["width"] <= right, (theme, badge_box, card_box)

    card_fits("light")
    # The same card in the dark theme (JupyterLab's own command, as Settings > Theme).
    for theme, light in (("JupyterLab Dark", "false"), ("JupyterLab Light", "true")):
        page.evaluate(
            "(t) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", theme
        )
        page.wait_for_function("(l) => document.body.dataset.jpThemeLight === l", arg=light)
        card_fits(theme)
        if light == "false":
            shot("culled-dark")
    assert [r["state"] for r in hub.requests_of("alice")] == ["parked"]
    card = panel.locator(".jp-gpuaas-quota-row", has_text="vision · a100")
    assert "parked 1" in card.inner_text(), card.inner_text()
    assert panel.locator('.jp-gpuaas-device[data-owner="mine"]').count() == 0
    shot("culled")

    # 5. The culled kernel's session is gone: the notebook says "No Kernel" (JupyterLab
    # notices within its sessions poll). She selects the GPU kernel again and runs the
    # cell: the GPU at once, from the parked reservation.
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.kernelDisplayName"
        " === 'No Kernel'"
    )
    page.evaluate(
        """async () => {
             const app = window.jupyterapp;
             await app.commands.execute('notebook:clear-all-cell-outputs');
             await app.shell.currentWidget.sessionContext.changeKernel({name: 'python3-gpu'});
           }"""
    )
    run_cell(page)
    page.locator(".jp-OutputArea-output", has_text=re.compile(r"GPU \d")).first.wait_for()
    marks["resumed"] = time.monotonic() - started
    mine = {r["id"]: r for r in hub.requests_of("alice")}
    assert mine[rid]["state"] == "finished", mine[rid]
    assert str(mine[rid]["reason"]).startswith("reservation claimed by"), mine[rid]
    (resumed,) = [r for r in mine.values() if r["id"] != rid]
    assert (resumed["kind"], resumed["state"]) == ("kernel", "admitted"), resumed
    assert kernels_of(hub, page)[NAME]["request_id"] == resumed["id"]
    sidebar_settles(hub, page, quota, 1, [], "fast-idle-resumed")
    ended = panel.locator(f'.jp-gpuaas-history li[data-key="{rid}"]')
    assert ended.locator(".jp-gpuaas-reason").inner_text() == "Resumed by a new request."
    shot("resumed")

    lines = [f"{what}: {t:.0f} s" for what, t in marks.items()]
    report = "fast-idle tour (login to resume), wall time from the Hub's first answer:\n  "
    report += "\n  ".join(lines)
    print(report)
    (ARTIFACTS / "fast-idle-times.txt").write_text(report + "\n")
