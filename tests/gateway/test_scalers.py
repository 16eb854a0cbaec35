"""Scalers: a real command, a real webhook server, failures logged and never raised."""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import tornado.httpserver
import tornado.web
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpuaas.devices import SimulatedInventory, parse_devices_spec
from jupyter_gpuaas.gateway.scalers import (
    CommandScaler,
    NoneScaler,
    PrometheusScaler,
    Scaler,
    SimulatedScaler,
    WebhookScaler,
    scaler_from_name,
)

LOGGER = "jupyter_gpuaas.tests.scalers"


def _log() -> logging.Logger:
    return logging.getLogger(LOGGER)


# --- command ---------------------------------------------------------------------------


def _recorder(tmp_path: Path) -> tuple[list[str], Path]:
    script = tmp_path / "scale.py"
    out = tmp_path / "calls.jsonl"
    script.write_text(
        "import json, sys\n"
        f"with open({str(out)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    return [sys.executable, str(script)], out


def _calls(out: Path) -> list[list[str]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.asyncio
async def test_command_scaler_runs_argv_per_changed_flavor(tmp_path: Path) -> None:
    base, out = _recorder(tmp_path)
    config = Config()
    config.CommandScaler.argv = [*base, "--pool", "gpu-{flavor}", "{desired}", "{ready}"]
    scaler = scaler_from_name("command", config=config)
    assert isinstance(scaler, CommandScaler) and not scaler.manages_provisioning

    await scaler.apply({"a100": 3, "t4": 1}, {"a100": 2, "t4": 1})
    assert sorted(_calls(out)) == [["--pool", "gpu-a100", "3", "2"], ["--pool", "gpu-t4", "1", "1"]]
    # Unchanged demand runs nothing; a changed flavor runs alone.
    await scaler.apply({"a100": 3, "t4": 1}, {"a100": 3, "t4": 1})
    await scaler.apply({"a100": 4, "t4": 1}, {"a100": 3, "t4": 1})
    assert _calls(out)[2:] == [["--pool", "gpu-a100", "4", "3"]]


@pytest.mark.asyncio
async def test_command_scaler_failure_is_logged_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    flag = tmp_path / "ok"
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, sys\n"
        f"if not os.path.exists({str(flag)!r}):\n"
        "    sys.stderr.write('cloud says no quota\\n'); sys.exit(3)\n"
    )
    scaler = CommandScaler(argv=[sys.executable, str(script), "{flavor}"], log=_log())
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        await scaler.apply({"a100": 2}, {"a100": 1})
    assert "exited 3" in caplog.text and "cloud says no quota" in caplog.text
    assert scaler.last_applied == {}
    flag.write_text("")
    await scaler.apply({"a100": 2}, {"a100": 1})  # same demand: retried because it failed
    assert scaler.last_applied == {"a100": 2}


@pytest.mark.asyncio
async def test_command_scaler_missing_binary_and_timeout_do_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = CommandScaler(argv=[str(tmp_path / "nope"), "{flavor}"], log=_log())
    slow = CommandScaler(
        argv=[sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3, log=_log()
    )
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        await missing.apply({"a100": 1}, {})
        await slow.apply({"a100": 1}, {})
    assert "could not start" in caplog.text
    assert "killed after" in caplog.text
    assert missing.last_applied == {} and slow.last_applied == {}


def test_command_scaler_validates_placeholders() -> None:
    with pytest.raises(TraitError, match="bad placeholder"):
        CommandScaler(argv=["scale", "{flavour}"])
    with pytest.raises(TraitError):
        CommandScaler(timeout=0)
    assert CommandScaler(argv=["echo", "{{literal}}", "{desired}"]).argv[1] == "{{literal}}"


# --- webhook ---------------------------------------------------------------------------


class _Hook(tornado.web.RequestHandler):
    def initialize(self, received: list[dict[str, Any]], status: list[int]) -> None:
        self.received = received
        self.status = status

    def post(self) -> None:
        self.received.append(
            {"body": json.loads(self.request.body), "auth": self.request.headers.get("X-Token")}
        )
        self.set_status(self.status[0])
        self.finish("{}")


@pytest_asyncio.fixture
async def webhook_server() -> AsyncIterator[tuple[str, list[dict[str, Any]], list[int]]]:
    received: list[dict[str, Any]] = []
    status = [200]
    app = tornado.web.Application([(r"/scale", _Hook, {"received": received, "status": status})])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets([sock])
    try:
        yield f"http://127.0.0.1:{port}/scale", received, status
    finally:
        server.stop()
        await server.close_all_connections()


@pytest.mark.asyncio
async def test_webhook_scaler_posts_json(
    webhook_server: tuple[str, list[dict[str, Any]], list[int]],
) -> None:
    url, received, _ = webhook_server
    config = Config()
    config.WebhookScaler.url = url
    config.WebhookScaler.headers = {"X-Token": "s3cret"}
    scaler = scaler_from_name("webhook", config=config)
    await scaler.apply({"a100": 3}, {"a100": 2})
    assert received == [
        {"body": {"flavor": "a100", "desired_nodes": 3, "ready_nodes": 2}, "auth": "s3cret"}
    ]
    await scaler.apply({"a100": 3}, {"a100": 3})
    assert len(received) == 1  # unchanged demand is not re-sent


@pytest.mark.asyncio
async def test_webhook_scaler_failures_are_logged_and_retried(
    webhook_server: tuple[str, list[dict[str, Any]], list[int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, received, status = webhook_server
    status[0] = 503
    scaler = WebhookScaler(url=url, log=_log())
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        await scaler.apply({"t4": 2}, {"t4": 1})
    assert "answered 503" in caplog.text
    status[0] = 200
    await scaler.apply({"t4": 2}, {"t4": 1})
    assert len(received) == 2 and scaler.last_applied == {"t4": 2}


@pytest.mark.asyncio
async def test_webhook_scaler_unreachable_does_not_raise(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scaler = WebhookScaler(url=f"http://127.0.0.1:{port}/scale", timeout=2.0, log=_log())
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        await scaler.apply({"a100": 1}, {})
    assert "failed for a100" in caplog.text
    assert scaler.last_applied == {}


# --- the rest --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_simulated_scaler_mirrors_core_decisions_into_the_inventory() -> None:
    inventory = parse_devices_spec("simulated:a100=1x4")
    assert isinstance(inventory, SimulatedInventory)
    scaler = scaler_from_name("simulated")
    assert isinstance(scaler, SimulatedScaler) and scaler.manages_provisioning
    scaler.inventory = inventory
    await scaler.apply({"a100": 2}, {"a100": 1})
    node = scaler.node_ready("a100", "a100-1")
    assert node is not None and node.gpus == 4
    assert scaler.node_ready("a100", "a100-1") == node  # idempotent
    assert [n.name for n in inventory.nodes()] == ["a100-0", "a100-1"]
    scaler.node_removed("a100-0")
    scaler.node_removed("a100-0")  # idempotent
    assert [n.name for n in inventory.nodes()] == ["a100-1"]


@pytest.mark.asyncio
async def test_none_and_prometheus_scalers_do_nothing() -> None:
    for name, cls in (("none", NoneScaler), ("prometheus", PrometheusScaler)):
        scaler = scaler_from_name(name)
        assert type(scaler) is cls and not scaler.manages_provisioning
        await scaler.apply({"a100": 5}, {"a100": 1})


def test_scaler_from_name_accepts_dotted_paths_and_rejects_the_rest() -> None:
    assert type(scaler_from_name("jupyter_gpuaas.gateway.scalers.WebhookScaler")) is WebhookScaler
    assert type(scaler_from_name("Command")) is CommandScaler
    with pytest.raises(ValueError, match="none, prometheus, command, webhook, simulated"):
        scaler_from_name("keda")
    with pytest.raises(ValueError, match="cannot import"):
        scaler_from_name("no.such.module.Scaler")
    with pytest.raises(ValueError, match="not a Scaler"):
        scaler_from_name("collections.OrderedDict")


def test_parent_config_reaches_the_scaler() -> None:
    from traitlets.config import Application

    app = Application()
    app.config.CommandScaler.argv = ["true"]
    scaler = scaler_from_name("command", parent=app)
    assert isinstance(scaler, Scaler) and scaler.argv == ["true"]  # type: ignore[attr-defined]
