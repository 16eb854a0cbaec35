"""The client library (sync, against a real gateway subprocess), its environment lookup,
and the `status`/`submit`/`cancel`/`gateway` commands of the console script."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gwutil import ROOT, TOKENS, free_port, gateway_argv, launch_gateway

from jupyter_gpuaas.client import GatewayError, SyncGatewayClient, gateway_from_env

EXE = ROOT / ".venv" / "bin" / "jupyter-gpuaas"


def cli(
    argv: list[str], url: str | None = None, who: str = "alice"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUAAS_", "JUPYTERHUB_"))}
    if url:
        env.update(GPUAAS_URL=url, GPUAAS_TOKEN=TOKENS[who])
    cmd = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "jupyter_gpuaas.cli"]
    return subprocess.run(cmd + argv, capture_output=True, text=True, env=env, timeout=60)


def test_from_env() -> None:
    assert gateway_from_env({"GPUAAS_URL": "http://h:1", "GPUAAS_TOKEN": "t"}) == (
        "http://h:1/",
        "t",
    )
    # Inside JupyterHub: through the public proxy, never the Hub's own port (8081), which
    # answers /services/... with a redirect.
    hub = {
        "JUPYTERHUB_API_URL": "http://hub:8081/hub/api",
        "JUPYTERHUB_API_TOKEN": "j",
        "JUPYTERHUB_PUBLIC_HUB_URL": "https://jupyter.example.org/hub/",
        "JUPYTERHUB_BASE_URL": "/",
    }
    assert gateway_from_env(hub) == ("https://jupyter.example.org/services/gpuaas/", "j")
    prefixed = {**hub, "JUPYTERHUB_PUBLIC_HUB_URL": "https://x.org/lab/hub/"}
    prefixed["JUPYTERHUB_BASE_URL"] = "/lab/"
    assert gateway_from_env(prefixed)[0] == "https://x.org/lab/services/gpuaas/"
    assert gateway_from_env({**hub, "GPUAAS_TOKEN": "g"})[1] == "g"
    # No public URL and no GPUAAS_URL (the spawner sets it): say how, never guess 8081.
    with pytest.raises(GatewayError, match="set GPUAAS_URL"):
        gateway_from_env({**hub, "JUPYTERHUB_PUBLIC_HUB_URL": ""})
    with pytest.raises(GatewayError, match="set GPUAAS_URL"):
        gateway_from_env({})
    with pytest.raises(GatewayError, match="GPUAAS_TOKEN"):
        gateway_from_env({"GPUAAS_URL": "http://h:1"})
    c = SyncGatewayClient.from_env({"GPUAAS_URL": "http://h:1/x", "GPUAAS_TOKEN": "t"})
    assert c.url == "http://h:1/x/"


def test_sync_client_against_subprocess(spawn_gateway: Any, sqlite_url: str) -> None:
    gp = spawn_gateway(sqlite_url)
    alice = SyncGatewayClient(gp.url, TOKENS["alice"])
    assert alice.me()["tenants"] == ["vision"]
    r = alice.submit("vision", "kernel", 2, name="x")
    assert r["state"] == "admitted" and r["name"] == "x"
    assert alice.get(r["id"])["grant"]["node"] == "a100-0"
    assert [x["id"] for x in alice.list(state="admitted")] == [r["id"]]
    assert alice.heartbeat(r["id"], busy=True, utilization=0.5)["grant"]["utilization"] == 0.5
    assert alice.devices()["simulated"] is True
    assert alice.tenants()["simulated"] is True
    with pytest.raises(GatewayError) as e:
        alice.submit("nlp", "job", 1)
    assert (e.value.status, e.value.field) == (403, "tenant")
    with pytest.raises(GatewayError) as e:
        alice.put_tenant("vision", {"quota": {"a100": 8}})
    assert e.value.status == 403
    assert alice.cancel(r["id"])["state"] == "finished"
    # The blocking face runs GatewayClient's own submit: the Idempotency-Key it retries
    # with makes a second submission with the same key the same request.
    once = alice.submit("vision", "kernel", 1, idempotency_key="sync-once")
    assert alice.submit("vision", "kernel", 1, idempotency_key="sync-once")["id"] == once["id"]
    assert len(alice.list(state="admitted")) == 1

    async def inside_a_loop() -> str:  # a notebook's kernel runs an event loop
        return alice.cancel(once["id"])["state"]

    assert asyncio.run(inside_a_loop()) == "finished"
    with pytest.raises(GatewayError) as e:
        SyncGatewayClient(gp.url, "wrong-token-1").devices()
    assert e.value.status == 401
    gone = SyncGatewayClient(f"http://127.0.0.1:{free_port()}/", "t", timeout=2)
    with pytest.raises(GatewayError, match="cannot reach"):
        gone.devices()

    # the console script's client commands
    out = cli(["submit", "--tenant", "vision", "--gpus", "1", "--kind", "kernel", "--json"], gp.url)
    assert out.returncode == 0, out.stderr
    rid = json.loads(out.stdout)["id"]
    out = cli(["status"], gp.url)
    assert out.returncode == 0, out.stderr
    assert "SIMULATED" in out.stdout and rid in out.stdout
    # Counted in words: "on 1 node", "on 3 nodes", never "on 1 nodes" (issue 45).
    assert re.search(r"GPUs free on (1 node|([02-9]|\d\d+) nodes)$", out.stdout, re.M), out.stdout
    assert (
        "  vision uses 1 of its 4 a100\n" in out.stdout and "  vision has no t4 quota" in out.stdout
    )
    status = json.loads(cli(["status", "--json"], gp.url).stdout)
    assert status["me"]["name"] == "alice" and status["requests"][0]["id"] == rid
    out = cli(["cancel", rid], gp.url)
    assert out.returncode == 0 and "finished" in out.stdout, out
    out = cli(["cancel", rid], gp.url)
    assert out.returncode == 1 and "already ended" in out.stderr and "Traceback" not in out.stderr
    out = cli(["submit", "--tenant", "nlp", "--gpus", "1"], gp.url)
    assert out.returncode == 1 and "not a member" in out.stderr


@pytest.mark.slow
def test_cli_bad_input_and_no_gateway() -> None:
    for argv in (
        ["submit", "--tenant", "vision", "--gpus", "0"],
        ["submit", "--tenant", "vision", "--gpus", "two"],
        ["submit", "--gpus", "1"],
        ["submit", "--tenant", "v", "--gpus", "1", "--kind", "gpu"],
    ):
        out = cli(argv, "http://127.0.0.1:9/")
        assert out.returncode == 2, (argv, out)
        assert "Traceback" not in out.stderr and "error:" in out.stderr
    out = cli(["status"])
    assert out.returncode == 1 and "GPUAAS_URL" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_gateway_command_bad_config(tmp_path: Path, sqlite_url: str) -> None:
    argv = gateway_argv(tmp_path, sqlite_url, free_port())[3:]  # the flags only
    cases = [
        (["--port=http"], "port"),
        (["--lease-ttl=-1"], "lease_ttl"),
        (["--devices=bogus"], "--devices"),
        (["--scaler=nope"], "--scaler"),
        (["--quotas=/nonexistent.yaml"], "--quotas"),
    ]
    bad_quotas = tmp_path / "bad.yaml"
    bad_quotas.write_text("flavors: {a100: {nodes: 1, gpus_per_node: 0}}\ntenants: {}\n")
    cases.append(([f"--quotas={bad_quotas}"], "flavors.a100.gpus_per_node"))
    bad_names = tmp_path / "names.yaml"  # a tenant name breaking the one name rule
    bad_names.write_text(
        "flavors: {a100: {nodes: 1, gpus_per_node: 4}}\n"
        "tenants: {Vision_Team: {quota: {a100: 1}}}\n"
    )
    cases.append(([f"--quotas={bad_names}"], "tenants.Vision_Team: is not a valid name"))
    for extra, text in cases:
        names = {e.split("=")[0] for e in extra}
        kept = [a for a in argv if a.split("=")[0] not in names]
        out = cli(["gateway", *kept, *extra])
        assert out.returncode == 2, (extra, out.stdout, out.stderr)
        assert text in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow
def test_gateway_command_serves(tmp_path: Path, sqlite_url: str) -> None:
    """`jupyter-gpuaas gateway --port N --quotas q.yaml ...`: the real console script."""
    cmd = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "jupyter_gpuaas.cli"]
    gp = launch_gateway(
        tmp_path, sqlite_url, command=[*cmd, "gateway"], base_url="/services/gpuaas/"
    )
    try:
        assert gp.url.endswith("/services/gpuaas/")
        assert SyncGatewayClient(gp.url, TOKENS["bob"]).me()["name"] == "bob"
    finally:
        gp.stop()
