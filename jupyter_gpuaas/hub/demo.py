"""`jupyter-gpuaas demo`: the local demo hub (what `make demo` runs).

Starts JupyterHub with the package's hub_config/local/jupyterhub_config.py (shipped in the
wheel, so it runs from any directory): configurable-http-proxy (from a checkout's
node_modules/, else PATH), the gateway as a Hub-managed service on SQLite, and queued
local-process spawners, on free internal ports. GPUs come from NVML when this machine has
any (the quota file is then written for its real flavor and count), else from simulated
a100s, said on the spawn page. It prints the URL and the logins once the Hub answers;
Ctrl-C, SIGTERM or SIGHUP stop the user servers (releasing their GPUs), then the Hub, the
proxy and the gateway (hub/supervise.py).
"""

from __future__ import annotations

import argparse
import errno
import importlib.resources
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]  # a checkout (or site-packages in a wheel)
FALLBACK_DEVICES = "simulated:a100=1x4"
USERS = (("alice", "vision"), ("bob", "vision"), ("carol", "nlp"))


def config_dir() -> Path:
    """The shipped hub_config/: jupyter_gpuaas/hub_config in an installed wheel (the build
    hook, hatch_build.py, copies it there); in a checkout (an editable install) the
    repository's own hub_config/, beside the package."""
    shipped = Path(str(importlib.resources.files("jupyter_gpuaas") / "hub_config"))
    if shipped.is_dir():
        return shipped
    return Path(__file__).resolve().parents[2] / "hub_config"


CONFIG = config_dir() / "local" / "jupyterhub_config.py"


# `--fast-idle`'s policy: the demo's warning -> Keep -> cull -> resume cycle in a few
# minutes (the shipped quota file culls after 30 min, with a 5-minute warning): warned
# after 30 s idle, 30 s to press Keep, parked 5 min. tests/ui/test_fast_idle_cycle.py
# walks the README's tour on it.
FAST_IDLE: dict[str, float] = {"idle_timeout": 60, "cull_warning": 30, "reservation_ttl": 300}


def fast_idle(text: str) -> str:
    """The quota file `text` with `FAST_IDLE`'s policy, for every tenant (a tenant's own
    idle settings would otherwise win over the policy's)."""
    import yaml

    data = yaml.safe_load(text) or {}
    for tenant in (data.get("tenants") or {}).values():
        if isinstance(tenant, dict):
            for key in FAST_IDLE:
                tenant.pop(key, None)
    data["policy"] = {**(data.get("policy") or {}), **FAST_IDLE}
    head = "# Written by `jupyter-gpuaas demo --fast-idle`: short idle times, to watch a cull\n"
    return head + yaml.safe_dump(data, sort_keys=False)


def _port(text: str) -> int:
    """An argparse type: a TCP port a server can listen on."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, not {text!r}")
    return int(text)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="start the local demo hub (JupyterHub + gateway) on http://127.0.0.1:8000",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--ip", default="127.0.0.1", help="public address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="public port (default 8000)")
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
    p.add_argument(
        "--quotas",
        help="the gateway's quota file (flavors, tenants, policy: the scenario format); "
        "default: the shipped hub_config/local/quotas.yaml, or one written for this "
        "machine's GPUs",
    )
    p.add_argument(
        "--fast-idle",
        action="store_true",
        help=f"short idle times, to watch a whole cull cycle in a few minutes: a GPU left "
        f"idle is warned after {FAST_IDLE['idle_timeout'] - FAST_IDLE['cull_warning']:.0f} s "
        f"(Keep), culled after {FAST_IDLE['idle_timeout']:.0f} s, and its quota parked for "
        f"{FAST_IDLE['reservation_ttl'] / 60:.0f} min for a quick resume",
    )
    p.add_argument(
        "--config",
        default=str(CONFIG),
        help="the JupyterHub config to run (default: the shipped "
        "hub_config/local/jupyterhub_config.py; a config of your own can load it with "
        "load_subconfig and change a few knobs)",
    )
    p.set_defaults(run=run)


def detect_devices(spec: str) -> tuple[str, str | None, int]:
    """(devices spec, flavor, GPUs per node) for the gateway: NVML's real GPUs, or the
    simulated fallback when NVML finds none. flavor None: keep the shipped quota file."""
    if not spec.startswith("nvml"):
        return spec, None, 0
    # The probe's "no NVML library" warning is for a gateway told to use NVML; here the
    # fallback to simulated GPUs is the expected outcome, said once in the banner.
    devices_log = logging.getLogger("jupyter_gpuaas.devices")
    level = devices_log.level
    devices_log.setLevel(logging.CRITICAL)
    try:
        from jupyter_gpuaas.devices import parse_devices_spec

        inventory = parse_devices_spec(spec)
        try:
            nodes = list(inventory.nodes())
        finally:
            inventory.close()
    except Exception:
        nodes = []
    finally:
        devices_log.setLevel(level)
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
    if devices == FALLBACK_DEVICES and args.devices.startswith("nvml"):
        lines.append("  no GPU found: simulated GPUs (queueing and quotas are real)")
    elif devices.startswith("simulated"):
        lines.append("  simulated GPUs (queueing and quotas are real)")
    lines += [f"  GPU page:    {url}services/gpuaas/", "  Ctrl-C stops it all."]
    lines.append("=" * 72)
    return "\n".join(lines)


def find_proxy() -> str | None:
    """configurable-http-proxy: a checkout's node_modules/ (make installs it), the current
    directory's, else PATH (`npm install -g configurable-http-proxy`)."""
    for base in (REPO, Path.cwd()):
        chp = base / "node_modules" / ".bin" / "configurable-http-proxy"
        if chp.exists():
            return str(chp)
    return shutil.which("configurable-http-proxy")


def port_problem(ip: str, port: int) -> str | None:
    """Why the public port cannot be had, or None (SO_REUSEADDR: a TIME_WAIT is free)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} on {ip} is already in use: pass --port with a free one"
            if e.errno == errno.EACCES:
                return f"port {port} on {ip} needs privileges: pass --port above 1023"
            return f"cannot listen on {ip}:{port} ({e.strerror}): check --ip and --port"
    return None


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports for the Hub's API, the proxy's API and the gateway."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def lock_state_dir(state: Path) -> IO[str] | None:
    """An exclusive lock on the state directory (held while the demo runs), or None when
    another demo holds it: two hubs on one SQLite file and one proxy pid file would fight."""
    import fcntl

    f = open(state / "demo.lock", "a+", encoding="utf-8")  # noqa: SIM115 (held for the run)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _local_url(ip: str, port: int) -> str:
    """The public URL as this machine reaches it (a wildcard address via loopback)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(ip, ip)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def run(args: argparse.Namespace) -> int:
    from jupyter_gpuaas.hub.supervise import Supervisor

    if len(args.password) < 8:
        print("demo: --password must be at least 8 characters", file=sys.stderr)
        return 2
    jupyterhub = shutil.which("jupyterhub") or str(Path(sys.executable).with_name("jupyterhub"))
    if not Path(jupyterhub).exists():
        print("demo: jupyterhub is not installed (pip install jupyter-gpuaas)", file=sys.stderr)
        return 2
    chp = find_proxy()
    if chp is None:
        print(
            "demo: configurable-http-proxy not found: run `npm ci` in a checkout (make demo "
            "does) or `npm install -g configurable-http-proxy`",
            file=sys.stderr,
        )
        return 2
    config = Path(args.config)
    if not config.is_file():
        print(f"demo: --config: no such file {args.config}", file=sys.stderr)
        return 2
    if args.quotas is not None and not Path(args.quotas).is_file():
        print(f"demo: --quotas: no such file {args.quotas}", file=sys.stderr)
        return 2
    problem = port_problem(args.ip, args.port)
    if problem is not None:
        print(f"demo: {problem}", file=sys.stderr)
        return 2
    state = Path(args.state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    lock = lock_state_dir(state)
    if lock is None:
        print(
            f"demo: {state} is used by another running demo: pass another --state-dir",
            file=sys.stderr,
        )
        return 2
    devices, flavor, gpus = detect_devices(args.devices)
    env = dict(os.environ)
    if args.quotas is not None:
        env["GPUAAS_DEMO_QUOTAS"] = str(Path(args.quotas).resolve())
    elif flavor is not None:
        quotas = state / "quotas.yaml"
        quotas.write_text(quotas_for(flavor, gpus), encoding="utf-8")
        env["GPUAAS_DEMO_QUOTAS"] = str(quotas)
    if args.fast_idle:
        source = Path(env.get("GPUAAS_DEMO_QUOTAS") or CONFIG.with_name("quotas.yaml"))
        fast = state / "quotas-fast-idle.yaml"
        fast.write_text(fast_idle(source.read_text(encoding="utf-8")), encoding="utf-8")
        env["GPUAAS_DEMO_QUOTAS"] = str(fast)
    admin_password = secrets.token_urlsafe(32)  # 43 characters; the Hub wants >= 32
    control_token = secrets.token_hex(32)
    # The proxy's API token, chosen here rather than by the Hub, so the demo can ask the
    # proxy whether the Hub's route is in (supervise.py) before it knocks at the public URL.
    proxy_token = secrets.token_hex(32)
    hub_port, proxy_api_port, gateway_port = free_ports(3)
    env.update(
        GPUAAS_DEMO_IP=args.ip,
        GPUAAS_DEMO_PORT=str(args.port),
        GPUAAS_DEMO_HUB_PORT=str(hub_port),
        GPUAAS_DEMO_PROXY_API_PORT=str(proxy_api_port),
        GPUAAS_DEMO_GATEWAY_PORT=str(gateway_port),
        GPUAAS_DEMO_PROXY=chp,
        GPUAAS_DEMO_PASSWORD=args.password,
        GPUAAS_DEMO_ADMIN_PASSWORD=admin_password,
        GPUAAS_DEMO_DEVICES=devices,
        GPUAAS_DEMO_STATE_DIR=str(state),
        GPUAAS_DEMO_CONTROL_TOKEN=control_token,
        GPUAAS_HUB_TOKEN=secrets.token_hex(32),
        CONFIGPROXY_AUTH_TOKEN=proxy_token,  # JupyterHub's default for the proxy's token
    )
    install_kernelspec(Path(env.get("GPUAAS_DEMO_QUOTAS") or CONFIG.with_name("quotas.yaml")))
    print(f"demo: starting JupyterHub on {_local_url(args.ip, args.port)} …", flush=True)
    ours = config.resolve() == CONFIG.resolve()
    supervisor = Supervisor(
        [jupyterhub, "-f", str(config.resolve())],
        env=env,
        cwd=str(state),
        url=_local_url(args.ip, args.port),
        control_token=control_token,
        # a --config of one's own may move the Hub: then only the public URL is checked
        hub_api=f"http://127.0.0.1:{hub_port}/hub/api/" if ours else None,
        proxy_routes=(f"http://127.0.0.1:{proxy_api_port}/api/routes", proxy_token)
        if ours
        else None,
        banner=lambda: _banner(args, admin_password, devices),
    )
    try:
        return supervisor.run()
    finally:
        lock.close()
