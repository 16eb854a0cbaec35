"""Pure parts of batch jobs: parameter values, the runner's command and environment, the
kernel a notebook job runs on, and refusals that need no gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jupyter_gpuaas.claim import Grant
from jupyter_gpuaas.jobs import model
from jupyter_gpuaas.jobs.execute import choose_kernel
from jupyter_gpuaas.jobs.manager import JobError, JobManager
from jupyter_gpuaas.jobs.runner import LocalProcessRunner
from jupyter_gpuaas.jobs.server_client import HOW_TO_CONFIGURE, ServerError, server_from_env


def test_parameter_values_are_typed_like_papermills() -> None:
    values = ["3", "-2", "0.5", "True", "false", "None", "lr", "1e-3", "3a"]
    assert [model.resolve_value(v) for v in values] == [
        3, -2, 0.5, True, False, None, "lr", 0.001, "3a"
    ]  # fmt: skip


def make_job(tmp_path: Path, **kw: object) -> model.Job:
    fields: dict[str, object] = dict(
        id="r1", kind="notebook", tenant="vision", gpus=2, cwd=str(tmp_path),
        outdir=str(model.output_dir(tmp_path, "r1")), source=str(tmp_path / "nb.ipynb"),
        parameters={"lr": 0.1},
    )  # fmt: skip
    fields.update(kw)
    return model.Job(**fields)  # type: ignore[arg-type]


def test_record_round_trip_and_paths(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    job.save()
    again = model.Job.load(tmp_path / "gpu-jobs" / "r1" / "job.json")
    assert again == job and again.output_notebook == tmp_path / "gpu-jobs" / "r1" / "nb.ipynb"
    out = job.to_json()
    assert out["log"].endswith("gpu-jobs/r1/output.log") and out["elapsed"] is None
    job.end(model.FAILED, "why", 3)
    assert not job.live and (job.state, job.reason, job.exit_status) == ("failed", "why", 3)


def test_runner_command_and_environment(tmp_path: Path) -> None:
    runner = LocalProcessRunner(env={"PATH": "/bin"})
    nb = make_job(tmp_path)
    argv = runner.command(nb)
    assert argv[:3] == [sys.executable, "-m", "jupyter_gpuaas.jobs.execute"]
    assert json.loads(argv[argv.index("--parameters") + 1]) == {"lr": 0.1}
    cell = make_job(tmp_path, kind="cell", source=None, python="/opt/py")
    assert runner.command(cell) == ["/opt/py", "-u", str(cell.script_path)]
    script = make_job(tmp_path, kind="script", source="/w/train.py", python=None)
    assert runner.command(script) == [sys.executable, "-u", "/w/train.py"]
    request = {"id": "r1", "state": "admitted", "grant": {"node": "n1", "devices": [2, 3]}}
    grant = Grant.of(request)
    assert grant is not None
    env = runner.environment(nb, grant)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["GPUAAS_JOB_ID"] == "r1"
    assert env["PATH"] == "/bin"


def test_a_notebook_saved_with_a_gpu_kernelspec_runs_on_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat

    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    write_spec(tmp_path / "data" / "kernels" / "gpu1", gpus=1, flavor="a100",
               display_name="Python 3 (1 GPU)")  # fmt: skip
    path = tmp_path / "nb.ipynb"
    nb = nbformat.v4.new_notebook()
    nbformat.write(nb, path)
    assert choose_kernel(str(path), None, "python3") == "python3"  # none saved
    nb.metadata["kernelspec"] = {"name": "gpu1", "display_name": "x"}
    nbformat.write(nb, path)
    assert choose_kernel(str(path), None, "python3") == "python3"  # would queue again
    assert choose_kernel(str(path), "other", "python3") == "other"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "x"}
    nbformat.write(nb, path)
    assert choose_kernel(str(path), None, "fallback") == "python3"


@pytest.mark.asyncio
async def test_refusals_without_a_gateway(tmp_path: Path) -> None:
    manager = JobManager(None, str(tmp_path), state_dir=str(tmp_path / "state"))
    (tmp_path / "nb.ipynb").write_text("not json")
    cases = [
        ({"kind": "notebook", "path": "nb.ipynb", "gpus": 1, "x": 1}, 400, "x"),
        ({"kind": "gpu", "gpus": 1}, 400, "kind"),
        ({"kind": "cell", "code": "1", "gpus": 0}, 400, "gpus"),
        ({"kind": "cell", "code": "1", "gpus": True}, 400, "gpus"),
        ({"kind": "cell", "code": "1", "gpus": 1, "parameters": []}, 400, "parameters"),
        ({"kind": "notebook", "path": "missing.ipynb", "gpus": 1}, 400, "path"),
        ({"kind": "notebook", "path": "nb.ipynb", "gpus": 1}, 400, "path"),
        ({"kind": "cell", "code": "1", "gpus": 1, "cwd": "nowhere"}, 400, "cwd"),
    ]
    for spec, status, fld in cases:
        with pytest.raises(JobError) as e:
            await manager.submit(spec)
        assert (e.value.status, e.value.field) == (status, fld), (spec, e.value.error)
    with pytest.raises(JobError) as e:
        await manager.submit({"kind": "cell", "code": "print(1)", "gpus": 1})
    assert e.value.status == 503 and "GPUAAS_URL" in e.value.error
    with pytest.raises(JobError) as e:
        await manager.cancel("nope")
    assert e.value.status == 404


def test_finding_the_server() -> None:
    with pytest.raises(ServerError) as e:
        server_from_env({})
    assert str(e.value) == HOW_TO_CONFIGURE
    assert server_from_env({"GPUAAS_SERVER_URL": "http://h:1/x", "GPUAAS_SERVER_TOKEN": "t"}) == (
        "http://h:1/x/", "t"
    )  # fmt: skip
    hub = {"JUPYTERHUB_SERVICE_URL": "http://h/user/a/", "JUPYTERHUB_API_TOKEN": "ht"}
    assert server_from_env(hub) == ("http://h/user/a/", "ht")
