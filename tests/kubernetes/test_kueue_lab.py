"""Item 4 of issue 42 in a browser: when Kueue preempts a notebook's GPU kernel, the open
notebooks are saved before it stops, and nothing the user typed is lost.

What a person has: JupyterLab (`jupyter lab`, a real server process with the
jupyter_gpuaas server extension and this checkout's sidebar) whose GPU kernels are pods of
the real `gpuaas-kubernetes` provisioner in Kueue mode, on the real control plane with the
real Kueue (kubeutil's `kernel_cluster`: her home claim and server pod, KwokKubelet playing
the kernel pod's container as a local process), and the gateway in Kueue mode following
the test's namespace; Debian's Chromium through Playwright. She opens two notebooks:
`train.ipynb` on a GPU kernel Kueue admits, where she runs a cell and then types an edit
she does not save, and `notes.ipynb` (a CPU kernel), which she leaves as it is on disk.
JupyterLab's autosave is off, so only our save can write her edit.

A Job of a higher WorkloadPriorityClass, from outside jupyter-gpuaas, takes the GPU back:
Kueue evicts the kernel's Workload and deletes its pod, which keeps the GPU through its
termination grace (KWOK is told to take the whole grace; otherwise it removes a deleted
pod at a random moment within it, and the warning could last no time at all). The
sidebar's row, the notebook's own line and one notification say when it will be stopped
and why, each in one sentence with no id, and the edited notebook is saved at once: the
file on disk holds the edit, JupyterLab's dirty mark clears. Then the grace ends early
(the pod force-deleted, as when the kernel exits at SIGTERM): the request ends as
preempted, "was stopped: …" replaces the warning's notification, the edited notebook was
saved once and the untouched one not rewritten (its bytes and mtime are the same), and
the file still holds the edit.

An asyncio test with Playwright's async API, not the module's shared `browser`: the
gateway, KwokKubelet and the cluster helpers live on the test's event loop, which
Playwright's sync API cannot share (tests/conftest.py's `chromium_browser` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import async_chromium, free_port, notebook, stop, wait_until
from kubefix import TOKENS
from kubeutil import KubeOnCluster, kernel_cluster
from test_kueue_mode import field_is_id, preemptible_vision
from tornado.httpclient import AsyncHTTPClient

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
EDIT = "lr = 0.01  # tuned, not saved yet"


@contextlib.asynccontextmanager
async def jupyterlab(
    tmp_path: Path, home: Path, gateway_url: str, kube: KubeOnCluster, flavors: dict[str, Any]
) -> AsyncIterator[str]:
    """`jupyter lab` on a free port, rooted at alice's home, with the server extension,
    this checkout's sidebar, a `gpu-kueue` kernelspec (1 GPU of the test's flavor, its pod
    in vision's LocalQueue) and JupyterLab's autosave off; yields its URL."""
    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    build = ROOT / "jupyter_gpuaas" / "labextension"
    if not (build / "package.json").exists():
        pytest.skip("the sidebar is not built: `make labextension` (make test does)")
    data, base = tmp_path / "jupyter-data", tmp_path / "lab"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "jupyter-gpuaas").symlink_to(build)
    flavor = next(iter(flavors))
    write_spec(data / "kernels" / "gpu-kueue", 1, flavor, kubernetes=True, display_name="GPU")
    settings = base / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    port = free_port()
    config = base / "jupyter_server_config.json"
    config.write_text(
        json.dumps(
            {
                "ServerApp": {
                    "ip": "127.0.0.1",
                    "port": port,
                    "port_retries": 0,
                    "open_browser": False,
                    "allow_root": True,
                    "root_dir": str(home),
                    "jpserver_extensions": {"jupyter_gpuaas": True},
                    "kernel_manager_class": "jupyter_gpuaas.server.GpuaasKernelManager",
                },
                "IdentityProvider": {"token": ""},
                "PasswordIdentityProvider": {"hashed_password": ""},
                "LabApp": {"expose_app_in_browser": True, "workspaces_dir": str(base / "ws")},
                "GpuaasExtension": {
                    "gateway_url": gateway_url,
                    "gateway_token": TOKENS["alice"],
                    "heartbeat_interval": 1.0,
                    "reconnect_delay": 0.5,
                },
                "GpuaasKubernetesProvisioner": {
                    "namespace": kube.namespace,
                    "flavors": flavors,
                    "server_pod_name": "jupyter-alice",
                    "image_name": "quay.io/jupyter/pytorch-notebook:2026-11",
                    "poll_interval": 0.2,
                    "pod_poll_interval": 0.1,
                    "launch_timeout": 60,
                    "tenant": "vision",
                    "kueue_queue": "{tenant}",
                },
                "JobManager": {"state_dir": str(base / "jobs")},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "GPUAAS_"))}
    env.update(
        JUPYTER_PATH=str(data),
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTERLAB_SETTINGS_DIR=str(base / "settings"),
        KUBECONFIG=str(kube.cluster.kubeconfig),
        KERNEL_USERNAME="alice",
        GP_RESPONSE_PORT=str(free_port()),  # gateway_provisioners' response address
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / "lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", f"--config={config}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=home,
        )
    url = f"http://127.0.0.1:{port}/"

    async def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited: {log.read_text()[-3000:]}")
        with contextlib.suppress(Exception):
            await AsyncHTTPClient().fetch(url + "api/status", request_timeout=2)
            return True
        return False

    try:
        await wait_until(answers, timeout=90, what="jupyter lab", interval=0.3)
        yield url
    except BaseException:
        print(f"--- jupyter lab log (last lines) ---\n{log.read_text()[-6000:]}")
        raise
    finally:
        await asyncio.to_thread(stop, proc, 20)


# The open document of a path (its widget in the main area), and whether it is dirty.
DOC_JS = "((p) => [...window.jupyterapp.shell.widgets('main')].find(w => w.context?.path === p))"
DIRTY_JS = f"(p) => {DOC_JS}(p).context.model.dirty"

# Every text the sidebar's preemption line of a row and the notebook's line ever show, and
# every save of a notebook (a PUT of its contents), as the page sees them: the warning may
# last only while the pod's grace does, so the page keeps what it saw.
WATCH_JS = """() => {
  const seen = (window.__gpuaasSeen = {row: [], notebook: [], toast: []});
  const keep = (list, selector) => {
    for (const e of document.querySelectorAll(selector)) {
      if (e.textContent && !list.includes(e.textContent)) list.push(e.textContent);
    }
  };
  const look = () => {
    keep(seen.row, '#jp-gpuaas-panel .jp-gpuaas-preempt');
    keep(seen.notebook, '.jp-gpuaas-notebook-line');
    keep(seen.toast, '.Toastify__toast--warning');
  };
  const all = {subtree: true, childList: true, characterData: true};
  new MutationObserver(look).observe(document.body, all);
}"""


async def test_an_open_notebook_is_saved_when_kueue_preempts_its_gpu_kernel(
    kube: KubeOnCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pre = await preemptible_vision(kube, tmp_path)
    quota, flavors, tenant = pre.quota, pre.flavors, pre.quota.tenant
    mine = {"gpuaas-test": kube.namespace}
    kube.add_node(f"kq-cpu-{quota.tag}", mine)
    gw = await quota.gateway(tmp_path)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        async with kernel_cluster(kube, gw.url, tmp_path, monkeypatch, flavors, mine) as cl:
            proj = cl.home / "proj"
            train, notes = proj / "train.ipynb", proj / "notes.ipynb"
            train.write_text(notebook("print(6 * 7)", "gpu-kueue", "GPU"))
            notes.write_text(notebook("print('notes')", "python3", "Python 3"))
            async with (
                jupyterlab(tmp_path, cl.home, gw.url, kube, flavors) as lab,
                async_chromium() as browser,
            ):
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(90_000)
                page.on("console", lambda m: m.type == "error" and print("console:", m.text))
                saves: list[str] = []
                page.on(
                    "request",
                    lambda r: (
                        saves.append(r.url)
                        if r.method == "PUT" and "/api/contents/" in r.url
                        else None
                    ),
                )
                await page.goto(lab + "lab")
                await page.wait_for_function("() => window.jupyterapp !== undefined")
                await page.evaluate("() => window.jupyterapp.restored")
                await page.locator('.jp-SideBar [data-id="jp-gpuaas-panel"]').click()
                panel = page.locator("#jp-gpuaas-panel")
                await panel.wait_for()
                await page.evaluate(WATCH_JS)
                open_js = "(p) => window.jupyterapp.commands.execute('docmanager:open', {path: p})"
                # notes.ipynb: opened, its kernel up (which writes its language into the
                # notebook), saved by her: clean, as it is on disk.
                await page.evaluate(open_js, "proj/notes.ipynb")
                await page.evaluate(
                    """async () => {
                         const w = window.jupyterapp.shell.currentWidget;
                         await w.context.ready;
                         await w.sessionContext.ready;
                         await w.sessionContext.session.kernel.info;
                       }"""
                )
                await page.wait_for_function(
                    f"() => {DOC_JS}('proj/notes.ipynb').model.getMetadata('language_info')"
                )
                await page.evaluate(f"() => {DOC_JS}('proj/notes.ipynb').context.save()")
                assert not await page.evaluate(DIRTY_JS, "proj/notes.ipynb")
                notes_before = (notes.read_bytes(), notes.stat().st_mtime_ns)
                await page.evaluate(open_js, "proj/train.ipynb")
                # A cell run on the GPU kernel: its pod admitted by Kueue, the kernel up.
                await page.evaluate(
                    """async () => {
                         const w = window.jupyterapp.shell.currentWidget;
                         await w.context.ready;
                         await w.sessionContext.ready;
                         await window.jupyterapp.commands.execute('notebook:run-cell');
                       }"""
                )
                nb = page.locator(".jp-NotebookPanel:visible")
                await nb.locator(".jp-OutputArea-output", has_text="42").wait_for()
                rid = (await gw_requests(gw.url, "alice", "kernel"))[0]["id"]
                assert await field_is_id(gw.url, rid, lambda r: r["state"] == "admitted")
                # She types an edit into the cell and does not save it.
                await nb.locator(".jp-Cell .cm-content").first.click()
                await page.keyboard.press("Control+End")
                await page.keyboard.press("Enter")
                await page.keyboard.type(EDIT)
                await page.wait_for_function(DIRTY_JS, arg="proj/train.ipynb")
                tab = page.locator(".lm-TabBar-tab", has_text="train.ipynb")
                assert "jp-mod-dirty" in (await tab.get_attribute("class") or "")
                assert EDIT not in train.read_text()
                saves.clear()  # the runs above may have saved nothing; count from here
                # The pod takes its whole termination grace to stop once deleted (KWOK
                # removes a deleted pod at a random time within its grace, unless told
                # a delay): the warning stands until this test ends the grace below.
                pod = ["pod", "-l", f"gpuaas.jupyter.org/request={rid}", "-n", kube.namespace]
                kube.cluster.kubectl("annotate", *pod, "pod-delete.stage.kwok.x-k8s.io/delay=1h")

                # Kueue takes the GPU back for a Job of a higher priority.
                pre.take_back()
                why = f"a higher-priority request of {tenant} needs the GPU"
                # The row, the notebook's own line and a notification say when and why.
                row = panel.locator(f'.jp-gpuaas-work li[data-key="{rid}"]')
                warned = await row.locator(".jp-gpuaas-preempt").inner_text()
                assert re.fullmatch(rf"⚠ It will be stopped in \d+ s: {why}\.", warned), warned
                await nb.locator(".jp-gpuaas-notebook-line").wait_for()  # shown
                line = await nb.locator(".jp-gpuaas-notebook-line").inner_text()
                kernel_words = rf"⚠ This notebook's GPU kernel will be stopped in \d+ s: {why}\."
                assert re.fullmatch(kernel_words, line), line
                toast = page.locator(".Toastify__toast--warning")
                told = (await toast.inner_text()).strip()
                assert re.fullmatch(
                    rf"Your GPU kernel train\.ipynb will be stopped in \d+ s: {why}\.", told
                ), told
                # Saved: on disk, and JupyterLab's dirty mark gone.
                try:
                    await wait_until(lambda: EDIT in train.read_text(), timeout=30, what="saved")
                except AssertionError:
                    await page.screenshot(path=str(ARTIFACTS / "kueue-preempt-unsaved.png"))
                    print("saves:", saves)
                    raise
                await page.wait_for_function(f"(p) => !({DIRTY_JS})(p)", arg="proj/train.ipynb")
                assert "jp-mod-dirty" not in (await tab.get_attribute("class") or "")
                await page.screenshot(path=str(ARTIFACTS / "kueue-preempt-saved.png"))
                # The grace ends early: the kernel's process exited at SIGTERM (as an
                # ipykernel does), and the pod is gone.
                kube.cluster.kubectl("delete", *pod, "--grace-period=0", "--force", "--wait=false")

                ended = await wait_until(
                    lambda: field_is_id(gw.url, rid, lambda r: r["state"] == "preempted"),
                    timeout=120,
                    what="the kernel's request preempted",
                )
                assert ended["reason"].startswith("preempted: ")
                await row.and_(page.locator('[data-state="preempted"]')).wait_for()
                seen = await page.evaluate("() => window.__gpuaasSeen")
                # One sentence each, the time in words, no ids; one warning notification.
                assert seen["row"] and seen["notebook"] and len(seen["toast"]) == 1, seen
                for said in [*seen["row"], *seen["notebook"], *seen["toast"]]:
                    assert "will be stopped in " in said and why in said, said
                    assert not re.search(r"\br-[0-9a-f]{6}", said), said  # no request id
                    assert said.endswith(".") and ". " not in said, said  # one sentence
                # Then that it was stopped, and the warning, now past, is gone.
                stopped = f"Your GPU kernel train.ipynb was stopped: {why}."
                await page.locator(".Toastify__toast", has_text=stopped).wait_for()
                await page.locator(".Toastify__toast--warning").wait_for(state="detached")
                # Saved once, the edited notebook only; the untouched one is not rewritten.
                assert [u.split("?")[0].rsplit("/", 1)[-1] for u in saves] == ["train.ipynb"], saves
                assert (notes.read_bytes(), notes.stat().st_mtime_ns) == notes_before
                # The kernel stopped; her edit is still on disk.
                assert EDIT in train.read_text()
                source = json.loads(train.read_text())["cells"][0]["source"]
                assert "".join(source) == f"print(6 * 7)\n{EDIT}", source
    finally:
        await gw.stop_server()
        pre.close()


async def gw_requests(url: str, user: str, kind: str) -> list[dict[str, Any]]:
    """The gateway's requests of `user` of `kind`, read as root."""
    headers = {"Authorization": f"token {TOKENS['root']}"}
    resp = await AsyncHTTPClient().fetch(url + "api/requests?limit=100", headers=headers)
    body = json.loads(resp.body)
    items = body["requests"] if isinstance(body, dict) else body
    return [r for r in items if r.get("user") == user and r.get("kind") == kind]
