"""`jupyter-gpuaas demo`: the local demo hub (what `make demo` runs).

Starts JupyterHub with hub_config/local/jupyterhub_config.py: configurable-http-proxy from
node_modules/, the gateway as a Hub-managed service on SQLite, and queued local-process
spawners. GPUs come from NVML when this machine has any (the quota file is then written
for its real flavor and count), else from simulated a100s, said on the spawn page. It
prints the URL and the logins; Ctrl-C stops the Hub, which stops the proxy, the gateway
and the servers it started.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hub_config" / "local" / "jupyterhub_config.py"
FALLBACK_DEVICES = "simulated:a100=1x4"
USERS = (("alice", "vision"), ("bob", "vision"), ("carol", "nlp"))


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="start the local demo hub (JupyterHub + gateway) on http://127.0.0.1:8000",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--ip", default="127.0.0.1", help="public address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="public port (default 8000)")
    p.add_argument(
        "--password",
        default="gpuaas-demo",
        help="the users' shared password, at least 8 characters (default gpuaas-demo)",
    )
    p.add_argument(
        "--devices",
        default="nvml",
        help=f"gateway devices: nvml (falls back to {FALLBACK_DEVICES} without a GPU), "
        "nvml:flavor=NAME, or simulated:FLAVOR=NODESxGPUS",
    )
    p.add_argument(
        "--state-dir",
        default=".gpuaas-demo",
        help="where the databases, homes and secrets go (default ./.gpuaas-demo)",
    )
    p.add_argument("--config", default=str(CONFIG), help="the JupyterHub config to run")
    p.set_defaults(run=run)


def detect_devices(spec: str) -> tuple[str, str | None, int]:
    """(devices spec, flavor, GPUs per node) for the gateway: NVML's real GPUs, or the
    simulated fallback when NVML finds none. flavor None: keep the shipped quota file."""
    if not spec.startswith("nvml"):
        return spec, None, 0
    try:
        from jupyter_gpuaas.devices import parse_devices_spec

        inventory = parse_devices_spec(spec)
        try:
            nodes = list(inventory.nodes())
        finally:
            inventory.close()
    except Exception:
        nodes = []
    if not nodes or nodes[0].gpus < 1:
        return FALLBACK_DEVICES, None, 0
    flavor = nodes[0].flavor
    return f"nvml:flavor={flavor}", flavor, nodes[0].gpus


def quotas_for(flavor: str, gpus: int) -> str:
    """A quota file like the shipped one, for this machine's real GPUs: half each team."""
    vision = max(1, gpus - gpus // 2)
    nlp = max(0, gpus - vision)
    reclaim = "preemption: {reclaim_within_cohort: Any}"  # as hub_config/local/quotas.yaml
    return (
        "# Written by `jupyter-gpuaas demo` for this machine's GPUs\n"
        f"flavors:\n  {flavor}: {{nodes: 1, gpus_per_node: {gpus}}}\n"
        "tenants:\n"
        f"  vision: {{cohort: demo, quota: {{{flavor}: {vision}}}, {reclaim}}}\n"
        f"  nlp: {{cohort: demo, quota: {{{flavor}: {nlp}}}, {reclaim}}}\n"
        "policy:\n  idle_timeout: 1800\n  reservation_ttl: 900\n  preemption_grace: 300\n"
    )


def demo_flavor(quotas: Path) -> str | None:
    """The first flavor of the quota file the demo's gateway runs with (None: unreadable)."""
    try:
        import yaml

        flavors = (yaml.safe_load(quotas.read_text(encoding="utf-8")) or {}).get("flavors")
    except (OSError, ValueError, AttributeError):
        return None
    return next(iter(flavors), None) if isinstance(flavors, dict) else None


def install_kernelspec(quotas: Path | None = None) -> None:
    """The "Python 3 (1 GPU)" kernelspec, of the quota file's flavor, in this environment.

    It goes to sys.prefix (the venv whose jupyterhub-singleuser the spawner runs), where
    the spawned servers' JupyterLab finds it, whatever HOME the spawner gives them.
    """
    if not (REPO / "jupyter_gpuaas" / "server" / "kernelspec_cli.py").exists():
        return
    flavor = demo_flavor(quotas or CONFIG.with_name("quotas.yaml"))
    cmd = [
        sys.executable,
        "-m",
        "jupyter_gpuaas.cli",
        "kernelspec",
        "install",
        "--gpus",
        "1",
        *(["--flavor", flavor] if flavor else []),
        "--name",
        "python3-gpu",
        "--display-name",
        "Python 3 (1 GPU)",
        "--sys-prefix",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"demo: could not install the GPU kernelspec: {done.stderr.strip()}", flush=True)


def _banner(args: argparse.Namespace, admin_password: str, devices: str) -> str:
    url = f"http://{args.ip}:{args.port}/"
    lines = [
        "",
        "=" * 72,
        f"  jupyter-gpuaas demo hub: {url}",
        "",
        f"  users (password {args.password!r}):",
    ]
    lines += [f"    {name:<6} team {team}" for name, team in USERS]
    lines += [
        f"  admin  (password {admin_password})",
        "",
        f"  GPUs: {devices}",
    ]
    if devices.startswith("simulated"):
        lines.append("  No GPU found: devices are SIMULATED (queueing and quotas are real).")
    lines += [f"  GPU page:    {url}services/gpuaas/", "  Ctrl-C stops it all."]
    lines.append("=" * 72)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if len(args.password) < 8:
        print("demo: --password must be at least 8 characters", file=sys.stderr)
        return 2
    jupyterhub = shutil.which("jupyterhub") or str(Path(sys.executable).with_name("jupyterhub"))
    if not Path(jupyterhub).exists():
        print("demo: jupyterhub is not installed (pip install -e .)", file=sys.stderr)
        return 2
    if not (REPO / "node_modules" / ".bin" / "configurable-http-proxy").exists() and not (
        shutil.which("configurable-http-proxy")
    ):
        print(
            "demo: configurable-http-proxy not found: run `npm ci` in the repository "
            "(make demo does)",
            file=sys.stderr,
        )
        return 2
    state = Path(args.state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    devices, flavor, gpus = detect_devices(args.devices)
    env = dict(os.environ)
    if flavor is not None:
        quotas = state / "quotas.yaml"
        quotas.write_text(quotas_for(flavor, gpus), encoding="utf-8")
        env["GPUAAS_DEMO_QUOTAS"] = str(quotas)
    admin_password = secrets.token_urlsafe(32)  # 43 characters; the Hub wants >= 32
    env.update(
        GPUAAS_DEMO_IP=args.ip,
        GPUAAS_DEMO_PORT=str(args.port),
        GPUAAS_DEMO_PASSWORD=args.password,
        GPUAAS_DEMO_ADMIN_PASSWORD=admin_password,
        GPUAAS_DEMO_DEVICES=devices,
        GPUAAS_DEMO_STATE_DIR=str(state),
        GPUAAS_HUB_TOKEN=secrets.token_hex(32),
    )
    install_kernelspec(Path(env.get("GPUAAS_DEMO_QUOTAS") or CONFIG.with_name("quotas.yaml")))
    hub = subprocess.Popen(
        [jupyterhub, "-f", args.config],
        cwd=str(state),
        env=env,
        start_new_session=True,  # Ctrl-C is ours to forward, once, to the whole hub
    )
    print(_banner(args, admin_password, devices), flush=True)
    try:
        return hub.wait()
    except KeyboardInterrupt:
        print("\ndemo: stopping the hub, the proxy, the gateway and the servers…", flush=True)
        hub.send_signal(signal.SIGINT)
        try:
            hub.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGTERM)
            try:
                hub.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(hub.pid, signal.SIGKILL)
                hub.wait()
        return 0
