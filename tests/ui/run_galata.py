"""Run the sidebar's Galata UI tests (labextension/ui-tests/) against real processes.

Starts, on free ports, what a person would have: a standalone gateway with simulated
devices (`jupyter-gpuaas gateway`, docs/tutorials/gateway-api.md) and JupyterLab
(`jupyter lab`) with the `jupyter_gpuaas` server extension and the prebuilt sidebar, GPU
kernelspecs and a notebook to run as a job. Then runs `jlpm playwright test` on Debian's
Chromium, and stops both by their PIDs. Exits with Playwright's status, so `make uitest`
fails when a UI test does. Screenshots land in test-artifacts/ui/.

The quota file gives the two tenants of the test user one a100 each on a node of two:
`vision` never culls (the queue and job tests), `scratch` culls after a short idle time
with a warning first (the Keep test). `cv` (alice's) and `nlp` (bob's, whose token the
tests use to submit through the gateway's REST API) share the cohort `shared`, reclaim
their lent GPUs (`reclaim_within_cohort: Any`) and give a victim `PREEMPTION_GRACE`
seconds (the preemption test). The last test stops the gateway and starts it again, on
the same port and store, from the command line this script passes it; this script stops
that second gateway too (its PID file). A second JupyterLab, of carol (view scope), shows
one test the Devices section as a viewer sees it: other users' names.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# srvutil (the server tests' helpers) imports tests/helpers.py: both directories go on the path.
sys.path[:0] = [str(ROOT / "tests" / "server"), str(ROOT / "tests")]
from srvutil import free_port, gateway_command  # noqa: E402

USER_TOKEN = "ui-alice-token-0123456789"
OTHER_TOKEN = "ui-bob-token-0123456789"
ADMIN_TOKEN = "ui-admin-token-0123456789"
#: carol: a member of `vision` with the view scope, the user of the second (viewer) lab.
VIEWER_TOKEN = "ui-carol-token-0123456789"
ARTIFACTS = ROOT / "test-artifacts" / "ui"
#: Idle seconds before the `scratch` tenant's GPU kernels are culled, and the warning lead.
#: The warning comes at 12 s idle: a Keep shows "Kept" for those 12 s until the next warning
#: (at 24 s it was 6 s, and one CI run's browser missed that window).
SCRATCH_IDLE = 30
CULL_WARNING = 18
#: Seconds a warned preemption victim of `cv` keeps its GPU.
PREEMPTION_GRACE = 15


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not answer:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_pid(pid: int) -> None:
    """Stop a process this run started but does not hold a Popen of (SIGTERM, then KILL)."""
    if pid <= 0:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(150):
            time.sleep(0.1)
            os.kill(pid, 0)
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main() -> int:
    from jupyter_gpuaas.server.kernelspec_cli import write_spec

    venv_bin = ROOT / ".venv" / "bin"
    base = Path(tempfile.mkdtemp(prefix="gpuaas-ui-"))
    gdir, root, data = base / "gateway", base / "root", base / "data"
    for d in (gdir, root, data):
        d.mkdir()
    # This checkout's build of the sidebar, first on JUPYTER_PATH: the venv's own
    # labextensions entry may be another checkout's (a worktree shares the venv).
    (data / "labextensions").mkdir()
    (data / "labextensions" / "jupyter-gpuaas").symlink_to(ROOT / "jupyter_gpuaas" / "labextension")
    (gdir / "quotas.yaml").write_text(
        yaml.safe_dump(
            {
                "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
                "tenants": {
                    "vision": {"cohort": "lab", "quota": {"a100": 1}},
                    "scratch": {
                        "cohort": "sandbox",
                        "quota": {"a100": 1},
                        "idle_timeout": SCRATCH_IDLE,
                    },
                    **{
                        name: {
                            "cohort": "shared",
                            "quota": {"a100": 1},
                            "preemption": {"reclaim_within_cohort": "Any"},
                            "preemption_grace": PREEMPTION_GRACE,
                        }
                        for name in ("cv", "nlp")
                    },
                },
                "policy": {"idle_timeout": 0, "reservation_ttl": 30, "cull_warning": CULL_WARNING},
            }
        )
    )
    (gdir / "tokens.yaml").write_text(
        yaml.safe_dump(
            {
                "tokens": {
                    USER_TOKEN: {"user": "alice", "groups": ["vision", "scratch", "cv"]},
                    OTHER_TOKEN: {"user": "bob", "groups": ["nlp"]},
                    ADMIN_TOKEN: {"user": "root", "groups": [], "admin": True},
                    VIEWER_TOKEN: {"user": "carol", "groups": ["vision"], "view": True},
                }
            }
        )
    )
    kernels = data / "kernels"
    write_spec(kernels / "gpu1", gpus=1, flavor="a100", tenant="vision", display_name="GPU 1")
    write_spec(
        kernels / "gpu-scratch", gpus=1, flavor="a100", tenant="scratch", display_name="Scratch"
    )
    write_spec(kernels / "gpu-cv", gpus=1, flavor="a100", tenant="cv", display_name="CV")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "GPUAAS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    gport, lport, vport = free_port(), free_port(), free_port()
    gateway_url = f"http://127.0.0.1:{gport}/"
    glog, llog, vlog = base / "gateway.log", base / "lab.log", base / "viewer.log"
    gateway = lab = viewer = None
    gateway_argv = [
        *gateway_command(),
        "--ip=127.0.0.1",
        f"--port={gport}",
        f"--db-url=sqlite:///{gdir / 'gpuaas.sqlite'}",
        f"--quotas={gdir / 'quotas.yaml'}",
        f"--tokens={gdir / 'tokens.yaml'}",
        "--devices=simulated:a100=1x2",
        "--lease-ttl=10",
    ]
    restarted = base / "gateway2.pid"  # written by the test that starts it again
    try:
        with open(glog, "wb") as out:
            gateway = subprocess.Popen(
                gateway_argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=gdir,
            )
        wait_http(gateway_url + "api/openapi.json", gateway, glog, 60)

        import jupyterlab.galata

        config = base / "jupyter_server_config.json"
        config.write_text(
            json.dumps(
                {
                    "ServerApp": {
                        "ip": "127.0.0.1",
                        "port": lport,
                        "port_retries": 0,
                        "open_browser": False,
                        "allow_root": True,
                        "root_dir": str(root),
                        # Galata's own helpers (contents uploads) send no XSRF token.
                        "disable_check_xsrf": True,
                        "jpserver_extensions": {"jupyter_gpuaas": True},
                        "kernel_manager_class": "jupyter_gpuaas.server.GpuaasKernelManager",
                    },
                    "IdentityProvider": {"token": ""},
                    "PasswordIdentityProvider": {"hashed_password": ""},
                    # Galata's in-page helpers (window.galata), shipped with JupyterLab.
                    "LabServerApp": {
                        "extra_labextensions_path": [str(Path(jupyterlab.galata.__file__).parent)]
                    },
                    "LabApp": {
                        "expose_app_in_browser": True,
                        "workspaces_dir": str(base / "workspaces"),
                    },
                    "GpuaasExtension": {
                        "gateway_url": gateway_url,
                        "gateway_token": USER_TOKEN,
                        "heartbeat_interval": 1.0,
                        "reconnect_delay": 0.5,
                    },
                    "GpuaasProvisioner": {"poll_interval": 0.5},
                    # Heartbeats well inside the gateway's 10 s lease (--lease-ttl above).
                    "JobManager": {
                        "poll_interval": 0.5,
                        "heartbeat_interval": 2.0,
                        "state_dir": str(base / "jobs"),
                    },
                }
            )
        )
        env_lab = dict(env, JUPYTER_PATH=str(data), JUPYTER_CONFIG_DIR=str(base / "config"))
        with open(llog, "wb") as out:
            lab = subprocess.Popen(
                [str(venv_bin / "jupyter"), "lab", f"--config={config}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env_lab,
                cwd=root,
            )
        # A second, bare JupyterLab whose server holds carol's token (the view scope): the
        # Devices section names other users' holders there (one test opens it).
        (root / "viewer").mkdir()
        viewer_config = base / "viewer_config.json"
        viewer_config.write_text(
            json.dumps(
                {
                    "ServerApp": {
                        "ip": "127.0.0.1",
                        "port": vport,
                        "port_retries": 0,
                        "open_browser": False,
                        "allow_root": True,
                        "root_dir": str(root / "viewer"),
                        "jpserver_extensions": {"jupyter_gpuaas": True},
                        "kernel_manager_class": "jupyter_gpuaas.server.GpuaasKernelManager",
                    },
                    "IdentityProvider": {"token": ""},
                    "PasswordIdentityProvider": {"hashed_password": ""},
                    "LabApp": {"workspaces_dir": str(base / "viewer-workspaces")},
                    "GpuaasExtension": {"gateway_url": gateway_url, "gateway_token": VIEWER_TOKEN},
                    "JobManager": {"state_dir": str(base / "viewer-jobs")},
                }
            )
        )
        with open(vlog, "wb") as out:
            viewer = subprocess.Popen(
                [str(venv_bin / "jupyter"), "lab", f"--config={viewer_config}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env_lab, JUPYTER_CONFIG_DIR=str(base / "viewer-config")),
                cwd=root / "viewer",
            )
        lab_url = f"http://127.0.0.1:{lport}/"
        viewer_url = f"http://127.0.0.1:{vport}/"
        wait_http(lab_url + "api/status", lab, llog, 90)
        wait_http(viewer_url + "api/status", viewer, vlog, 90)

        # Not emptied first: `make test` runs this beside pytest, whose tests/ui write
        # their screenshots here too (each run overwrites its own files by name).
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        run_env = dict(
            env,
            TARGET_URL=lab_url.rstrip("/"),
            GPUAAS_GATEWAY_URL=gateway_url,
            GPUAAS_ADMIN_TOKEN=ADMIN_TOKEN,
            # The last test stops the gateway (by this PID) to see the panel say so.
            GPUAAS_GATEWAY_PID=str(gateway.pid),
            # ... and starts it again: this command, in this folder, its PID in that file.
            GPUAAS_GATEWAY_ARGV=json.dumps(gateway_argv),
            GPUAAS_GATEWAY_CWD=str(gdir),
            GPUAAS_GATEWAY_LOG=str(base / "gateway2.log"),
            GPUAAS_GATEWAY_PIDFILE=str(restarted),
            GPUAAS_OTHER_TOKEN=OTHER_TOKEN,
            GPUAAS_VIEWER_URL=viewer_url,
            GPUAAS_PREEMPTION_GRACE=str(PREEMPTION_GRACE),
            GPUAAS_ROOT_DIR=str(root),
            GPUAAS_ARTIFACTS=str(ARTIFACTS),
            GPUAAS_SCRATCH_IDLE=str(SCRATCH_IDLE),
            PLAYWRIGHT_BROWSERS_PATH="0",
        )
        argv = ["jlpm", "playwright", "test", "--config", "ui-tests/playwright.config.js"]
        argv += sys.argv[1:]  # e.g. -g "cancel" to run one test
        rc = subprocess.call(argv, cwd=ROOT / "labextension", env=run_env)
        if rc != 0:
            logs = [("gateway", glog), ("jupyter lab", llog), ("viewer lab", vlog)]
            # The gateway the last test started again, when it got that far.
            logs += [("gateway, started again", base / "gateway2.log")]
            for name, log in logs:
                if log.exists():
                    print(f"--- {name} log (last lines) ---\n{log.read_text()[-4000:]}")
                    shutil.copy(log, ARTIFACTS / log.name)  # whole, beside the screenshots
        return rc
    finally:
        stop(viewer)
        stop(lab)
        stop(gateway)
        if restarted.exists():  # the gateway the last test started again, by its PID
            stop_pid(int(restarted.read_text().strip() or 0))
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
