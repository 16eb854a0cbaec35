"""Batch jobs end to end: the magics in an IPython shell, a real Jupyter server with the
extension, a real gateway with one simulated GPU, real processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from helpers import wait_for
from IPython.core.error import UsageError
from jobutil import BIN, TOKEN, Gateway, Server, clean_env, notebook, start_server

from jupyter_gpuaas.jobs.views import JobView
from jupyter_gpuaas.notebook.magics import line_parser


def hold_gpu(gateway: Gateway) -> str:
    """Alice's kernel holds the only GPU."""
    r = gateway.call("POST", "api/requests", {"tenant": "vision", "kind": "kernel", "gpus": 1},
                     token=TOKEN)  # fmt: skip
    assert r["state"] == "admitted", r
    return str(r["id"])


def job_dir(job: Any) -> Path:
    return Path(job.data["outdir"])


def test_notebook_job_waits_for_a_held_gpu_then_runs_with_parameters(
    shell: Any, server: Server, gateway: Gateway
) -> None:
    nb = notebook(
        server.root / "train.ipynb",
        "import os\nprint('result', x * 2, label, os.environ['CUDA_VISIBLE_DEVICES'])",
        parameters="x = 1\nlabel = 'default'",
    )
    held = hold_gpu(gateway)
    job = shell.run_line_magic("gpu", f"submit {nb.name} --gpus 1 -p x 21 -p label tuned")
    assert job.state == "queued", job.data
    view = JobView.from_job(job.data)
    assert view.headline.startswith("queued: position 1 of 1 for 1× GPU for vision"), view
    assert gateway.request(job.id)["state"] == "queued"
    # Still queued a moment later: it really waits for the GPU.
    assert job.refresh().state == "queued"

    gateway.call("DELETE", f"api/requests/{held}", token=TOKEN)
    job.wait(timeout=60)
    assert job.state == "succeeded", (job.data, job.logs())
    out = job_dir(job) / "train.ipynb"
    assert out == Path(job.data["output_notebook"]) and out.parent.parent.name == "gpu-jobs"
    executed = nbformat.read(out, as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert "x = 21" in injected[0].source and 'label = "tuned"' in injected[0].source
    texts = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "result 42 tuned 0" in texts  # CUDA_VISIBLE_DEVICES is the grant's device 0
    assert "result 42 tuned 0" in job.logs()
    record = json.loads((job_dir(job) / "job.json").read_text())
    assert record["state"] == "succeeded" and record["exit_status"] == 0
    wait_for(lambda: gateway.request(job.id)["state"] == "finished", what="release")
    assert gateway.free_gpus() == 1


def test_cell_job_runs_in_the_notebooks_directory_and_logs_follow(
    shell: Any, server: Server, gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    code = (
        "import os, time\n"
        "print('hello from', os.getcwd(), 'on GPU', os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "for i in range(3):\n"
        "    print('step', i, flush=True)\n"
        "    time.sleep(0.3)\n"
    )
    job = shell.run_cell_magic("gpu_job", "--gpus 1 --name steps", code)
    assert job.data["name"] == "steps" and job.data["kind"] == "cell"
    capsys.readouterr()
    shell.run_line_magic("gpu", f"logs {job.id} --follow")  # returns when the job ends
    out = capsys.readouterr().out
    assert f"hello from {server.root} on GPU 0" in out
    assert "step 0" in out and "step 2" in out
    assert job.wait(timeout=30).state == "succeeded"
    assert job_dir(job).parent == server.root / "gpu-jobs"
    shell.run_line_magic("gpu", "jobs")
    listing = capsys.readouterr().out
    assert job.id in listing and "succeeded" in listing and "steps" in listing
    wait_for(lambda: gateway.request(job.id)["state"] == "finished", what="release")


def test_a_running_jobs_view_shows_the_last_lines_and_no_kernel_noise(
    shell: Any, server: Server, gateway: Gateway
) -> None:
    """The widget's log tail, polled while a notebook job prints, is the newest lines;
    the job's log holds what the notebook printed, not its kernel's transport warning."""
    import re

    from jupyter_gpuaas.jobs.server_client import ServerClient
    from jupyter_gpuaas.notebook.widgets import JobWidget

    nb = notebook(
        server.root / "ticks.ipynb",
        "import time\nfor i in range(1500):\n    print('tick', i, flush=True)\n"
        "    time.sleep(0.01)",
    )
    job = shell.run_line_magic("gpu", f"submit {nb.name} --gpus 1")
    log = job_dir(job) / "output.log"

    def ticks_logged() -> list[int]:
        text = log.read_text(errors="replace") if log.exists() else ""
        return [int(n) for n in re.findall(r"^tick (\d+)$", text, re.M)]

    wait_for(lambda: len(ticks_logged()) > 300, timeout=90, what="300 ticks logged")
    client = ServerClient(server.url, server.env()["GPUAAS_SERVER_TOKEN"])
    widget = JobWidget(client, job.refresh().data, interval=3600)
    try:
        assert job.state == "running", job.data
        logged_before = max(ticks_logged())
        widget.refresh()
        shown = [int(n) for n in re.findall(r"tick (\d+)", widget.log.value)]
        assert shown and min(shown) > 200 and max(shown) >= logged_before, (shown, logged_before)
        assert shown == sorted(shown)  # in order, oldest of them first
        assert 0 < len(widget.log.value.split("<pre")[1].splitlines()) <= widget.tail_lines
    finally:
        widget.poller.stop()
    assert job.wait(timeout=120).state == "succeeded", job.data
    widget.refresh()
    assert "tick 1499" in widget.log.value and "[gpuaas] done" in widget.log.value
    text = log.read_text()
    assert text.startswith("[gpuaas] executing"), text[:300]
    assert "without encryption" not in text and "IPKernelApp" not in text, text[:1000]
    assert ticks_logged()[-1] == 1499  # (papermill logs a print split in chunks as it came)
    wait_for(lambda: gateway.request(job.id)["state"] == "finished", what="release")


def test_cancel_a_queued_and_a_running_job(
    shell: Any, server: Server, gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    held = hold_gpu(gateway)
    queued = shell.run_cell_magic("gpu_job", "--gpus 1", "print('never')")
    assert queued.state == "queued"
    shell.run_line_magic("gpu", f"cancel {queued.id}")
    assert "cancelled" in capsys.readouterr().out
    assert queued.refresh().state == "cancelled"
    assert gateway.request(queued.id)["state"] == "cancelled"
    gateway.call("DELETE", f"api/requests/{held}", token=TOKEN)

    # A running job with a grandchild: cancel kills the whole tree.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "open('pids.txt', 'w').write(f'{child.pid}')\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    running = shell.run_cell_magic("gpu_job", "--gpus 1", code)
    pids = server.root / "pids.txt"
    wait_for(lambda: running.refresh().state == "running" and pids.exists(), what="running")
    wait_for(lambda: pids.read_text(), what="pid file")
    child = int(pids.read_text())
    leader = int(running.data["pid"])
    assert psutil.pid_exists(child) and psutil.pid_exists(leader)
    shell.run_line_magic("gpu", f"cancel {running.id}")
    assert running.refresh().state == "cancelled"
    assert not _alive(child) and not _alive(leader)
    wait_for(lambda: gateway.request(running.id)["state"] == "finished", what="release")
    assert gateway.free_gpus() == 1
    pids.unlink()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_preempted_job_is_stopped_then_runs_again(
    shell: Any, server: Server, gateway: Gateway
) -> None:
    runs = server.root / "runs.txt"
    code = (
        "import time\n"
        "with open('runs.txt', 'a') as f:\n"
        "    f.write('run\\n')\n"
        "if open('runs.txt').read().count('run') < 2:\n"
        "    time.sleep(600)\n"
        "print('finished on run 2')\n"
    )
    job = shell.run_cell_magic("gpu_job", "--gpus 1", code)
    wait_for(lambda: runs.exists() and job.refresh().state == "running", what="first run")
    first_pid = int(job.data["pid"])
    urgent = gateway.call("POST", "api/requests", {"tenant": "vision", "kind": "kernel",
                          "gpus": 1, "priority": 10}, token=TOKEN)  # fmt: skip
    assert urgent["state"] == "admitted", urgent
    wait_for(lambda: job.refresh().state == "queued", what="requeued")
    assert job.data["reason"] == "preempted; queued again" and not _alive(first_pid)
    gateway.call("DELETE", f"api/requests/{urgent['id']}", token=TOKEN)
    assert job.wait(timeout=30).state == "succeeded", job.data
    assert runs.read_text().count("run") == 2
    assert "preempted: stopped, queued again" in job.logs()
    assert "finished on run 2" in job.logs()
    runs.unlink()
    wait_for(lambda: gateway.free_gpus() == 1, what="GPU free")


def test_failing_jobs_report_why_and_release_their_gpu(
    shell: Any, server: Server, gateway: Gateway
) -> None:
    cell = shell.run_cell_magic("gpu_job", "--gpus 1", "raise ValueError('bad batch size')")
    cell.wait(timeout=30)
    assert cell.state == "failed" and cell.data["exit_status"] == 1
    assert "ValueError: bad batch size" in cell.data["reason"]
    view = JobView.from_job(cell.data)
    assert view.error and "bad batch size" in view.error and view.done
    wait_for(lambda: gateway.request(cell.id)["state"] == "finished", what="release")

    nb = notebook(server.root / "broken.ipynb", "1 / 0")
    job = shell.run_line_magic("gpu", f"submit {nb} --gpus 1").wait(timeout=60)
    assert job.state == "failed"
    assert "ZeroDivisionError" in job.data["reason"], job.data
    assert Path(job.data["output_notebook"]).exists()  # papermill saves the failed run
    wait_for(lambda: gateway.request(job.id)["state"] == "finished", what="release")
    assert gateway.free_gpus() == 1


def test_refusals_raise_usage_errors_with_the_reason(
    shell: Any, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = notebook(server.root / "ok.ipynb", "print(1)")

    def err(line: str, cell: str | None = None) -> str:
        """IPython's UsageError: one red line in a notebook, and the cell fails."""
        with pytest.raises(UsageError) as raised:
            if cell is None:
                shell.run_line_magic("gpu", line)
            else:
                shell.run_cell_magic("gpu_job", line, cell)
        return str(raised.value)

    out = err("submit")  # no notebook
    assert out.startswith("%gpu submit: the following arguments are required: notebook"), out
    assert "usage: %gpu submit" in out
    assert line_parser().parse_args(["submit", nb.name]).gpus == 1  # --gpus defaults to 1
    out = err("frobnicate")
    assert "usage: %gpu" in out and "invalid choice" in out
    out = err(f"submit {nb.name} --gpus 1 --bogus")
    assert "usage:" in out and "--bogus" in out
    out = err("--bogus", "print(1)")
    assert "usage: %%gpu_job" in out
    out = err(f"submit {nb.name} --gpus zero")
    assert "must be a whole number" in out
    assert err("submit 'unbalanced").startswith("%gpu: ")
    assert "no such notebook" in err("submit missing.ipynb --gpus 1")
    assert "not a member of tenant 'nlp'" in err(f"submit {nb.name} --gpus 1 --tenant nlp")
    out = err(f"submit {nb.name} --gpus 4")
    assert "4 GPUs do not fit on one node" in out, out
    assert "the cell is empty" in err("--gpus 1", "   \n")
    assert not [j for j in server.call("GET", "gpuaas/jobs") if j["name"] == "ok.ipynb"]

    monkeypatch.delenv("GPUAAS_SERVER_URL")
    out = err("jobs")
    assert "GPUAAS_SERVER_URL" in out and "jupyter_gpuaas" in out


def test_the_magics_show_their_usage(shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`%gpu?` and `%%gpu_job?`, as typed in a cell: IPython's help shows every option."""
    capsys.readouterr()
    shell.run_cell("%gpu?")
    out = capsys.readouterr().out
    for usage in ("%gpu status", "%gpu submit", "%gpu jobs", "%gpu logs", "%gpu cancel"):
        assert usage in out, out
    assert "--parameter" in out or "-p NAME VALUE" in out
    shell.run_cell("%%gpu_job?")
    out = capsys.readouterr().out
    assert "%%gpu_job" in out and "--gpus GPUS" in out and "how many GPUs" in out, out
    shell.run_line_magic("gpu", "submit --help")  # a subcommand's help is not a failure
    assert "the notebook (.ipynb) to run" in capsys.readouterr().out


def test_a_refused_submit_stops_the_notebook(server: Server, tmp_path: Path) -> None:
    """Run All in a real kernel (nbclient, as papermill runs it): the cell with a bad
    `%gpu submit` fails with its sentence and the cells after it never run."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    for bad, sentence in (
        ("%gpu submit missing.ipynb --gpus 1", "no such notebook"),
        ("%gpu submit ok.ipynb --gpus zero", "must be a whole number"),
    ):
        nb = nbformat.read(
            notebook(tmp_path / "run.ipynb", "%load_ext jupyter_gpuaas", bad, "print('after')"),
            as_version=4,
        )
        client = NotebookClient(
            nb,
            timeout=120,
            kernel_name="python3",
            resources={"metadata": {"path": str(server.root)}},
        )
        env = {**clean_env(), **server.env()}
        with pytest.raises(CellExecutionError) as raised:
            client.execute(env=env)
        assert raised.value.ename == "UsageError", raised.value
        assert sentence in str(raised.value)
        # What the user reads under the cell: IPython's one red line, no traceback.
        [shown] = nb.cells[1].outputs
        assert shown["name"] == "stderr" and shown["text"].startswith("UsageError: %gpu submit")
        assert nb.cells[2].outputs == [] and nb.cells[2].execution_count is None
    assert not [j for j in server.call("GET", "gpuaas/jobs") if j["name"] == "missing.ipynb"]


def test_status_as_text(shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    shell.run_line_magic("gpu", "status")
    out = capsys.readouterr().out
    assert "1 of 1 GPUs free on 1 node (SIMULATED devices)" in out
    assert "you are alice; tenants you may charge: vision" in out
    assert "  vision uses none of its 1 a100" in out and "nlp" not in out.split("\n", 2)[2]


def test_shell_commands(server: Server, gateway: Gateway) -> None:
    # The job's kernel inherits the server's environment: %gpu works in there too.
    nb = notebook(
        server.root / "cli.ipynb",
        "print('n is', n)",
        "%load_ext jupyter_gpuaas\n%gpu jobs",
        parameters="n = 0",
    )
    env = {**clean_env(), **server.env()}

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "jupyter-gpuaas"), *argv], capture_output=True,
                              text=True, env=env, timeout=120)  # fmt: skip

    out = cli("submit", str(nb), "--gpus", "1", "-p", "n", "7", "--wait")
    assert out.returncode == 0, out
    assert "n is 7" in out.stdout and "succeeded" in out.stdout
    assert "cli.ipynb" in out.stdout.split("n is 7", 1)[1]  # %gpu jobs listed itself
    script = server.root / "train.py"
    script.write_text("import os\nprint('script on', os.environ['CUDA_VISIBLE_DEVICES'])\n")
    out = cli("submit", str(script), "--gpus", "1", "--json")
    job = json.loads(out.stdout)
    assert job["kind"] == "script"
    out = cli("logs", job["id"], "--follow")
    assert "script on 0" in out.stdout, out
    out = cli("jobs", "--json")
    assert {j["id"]: j["state"] for j in json.loads(out.stdout)}[job["id"]] in (
        "succeeded", "running"
    )  # fmt: skip
    assert cli("submit", "missing.ipynb", "--gpus", "1").returncode == 1
    out = cli("jobs")
    assert out.returncode == 0 and "cli.ipynb" in out.stdout
    bad = subprocess.run([str(BIN / "jupyter-gpuaas"), "jobs"], capture_output=True, text=True,
                         env=clean_env(), timeout=60)  # fmt: skip
    assert bad.returncode == 1 and "GPUAAS_SERVER_URL" in bad.stderr
    wait_for(lambda: gateway.free_gpus() == 1, what="GPU free")


def test_a_restarted_server_fails_its_orphaned_jobs(gateway: Gateway, tmp_path: Path) -> None:
    from jupyter_gpuaas.jobs.server_client import ServerClient

    first = start_server(gateway, tmp_path)
    try:
        client = ServerClient(first.url, first.env()["GPUAAS_SERVER_TOKEN"])
        job = client.submit({"kind": "cell", "code": "import time\ntime.sleep(600)\n",
                             "cwd": str(first.root), "gpus": 1})  # fmt: skip
        wait_for(lambda: client.job(job["id"])["state"] == "running", what="running")
        pid = int(client.job(job["id"])["pid"])
        first.proc.kill()  # no clean shutdown: the job's process outlives the server
        first.proc.wait()
        assert _alive(pid)
    finally:
        first.stop()
    second = start_server(gateway, tmp_path)
    try:
        client = ServerClient(second.url, second.env()["GPUAAS_SERVER_TOKEN"])
        after = client.job(job["id"])
        assert after["state"] == "failed" and after["reason"] == "server restarted"
        wait_for(lambda: not _alive(pid), what="the orphan killed")
        wait_for(lambda: gateway.request(job["id"])["state"] == "finished", what="release")
        record = json.loads((Path(after["outdir"]) / "job.json").read_text())
        assert record["state"] == "failed"
        # A clean stop ends its running jobs too: nobody would renew their leases.
        job = client.submit({"kind": "cell", "code": "import time\ntime.sleep(600)\n",
                             "cwd": str(second.root), "gpus": 1})  # fmt: skip
        wait_for(lambda: client.job(job["id"])["state"] == "running", what="running")
        pid = int(client.job(job["id"])["pid"])
    finally:
        second.stop()
    assert second.proc.returncode == 0, second.tail()
    record = json.loads((Path(job["outdir"]) / "job.json").read_text())
    assert (record["state"], record["reason"]) == ("failed", "server stopped")
    assert not _alive(pid)
    assert gateway.request(job["id"])["state"] == "finished"
