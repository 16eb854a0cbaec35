"""`GET metrics` against a real gateway process: who may scrape, and no user names in labels.

By default a scrape needs the view scope (as JupyterHub's `authenticate_prometheus`), and
the `user` label of the device series is present but empty. `--metrics-public` opens the
route, `--metrics-user-label` fills the label. Where promtool (Debian's `prometheus`
package, installed by scripts/ensure-system-deps.sh) is present, it lints both answers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest
from gwutil import TOKENS
from prometheus_client.parser import text_string_to_metric_families

from jupyter_gpuaas.client import SyncGatewayClient

DEVICE_SERIES = (
    "gpuaas_device_utilization_ratio",
    "gpuaas_device_memory_used_bytes",
    "gpuaas_device_healthy",
)


def scrape(url: str, who: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"token {TOKENS.get(who, who)}"} if who else {}
    req = urllib.request.Request(url + "metrics", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def device_labels(text: str) -> list[dict[str, str]]:
    out = []
    for family in text_string_to_metric_families(text):
        if family.name in DEVICE_SERIES:
            out += [dict(s.labels) for s in family.samples]
    return out


# INTERFACES.md's five, then dcgm-exporter's (metrics.py), on every device series.
DCGM = ("gpu", "UUID", "modelName", "Hostname", "GPU_I_PROFILE")
LABELS = tuple(sorted(("node", "device", "flavor", "tenant", "user", *DCGM)))


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        return  # linted where ensure-system-deps.sh could install prometheus
    # `modelName` is dcgm-exporter's spelling, kept so the series join with its (metrics.py);
    # promtool's lint wants snake_case, so that one known label is renamed for the lint only.
    text = re.sub(r"([{,])modelName=", r"\1model_name=", text)
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_metrics_need_the_view_scope_and_hide_user_names(
    spawn_gateway: Any, sqlite_url: str
) -> None:
    gw = spawn_gateway(sqlite_url)
    held = SyncGatewayClient(gw.url, TOKENS["alice"]).submit("vision", "kernel", 1)
    assert held["state"] == "admitted"

    status, body = scrape(gw.url, None)
    assert status == 401 and "authentication required" in body
    for who in ("alice", "bob", "eve"):  # users without view: their own API, not the queue
        status, body = scrape(gw.url, who)
        assert status == 403, (who, body)
        assert "needs the view scope" in body and "--metrics-public" in body
    for who in ("carol", "root"):  # view, admin
        status, text = scrape(gw.url, who)
        assert status == 200, (who, text)

    rows = device_labels(text)
    assert rows, text
    # The same label set on every series, held or free; the user label is always empty.
    assert {tuple(sorted(r)) for r in rows} == {LABELS}
    assert {r["user"] for r in rows} == {""}
    assert "vision" in {r["tenant"] for r in rows}  # the holder's tenant is still there
    assert "alice" not in text
    promtool_check(text)


def test_public_metrics_with_user_labels(spawn_gateway: Any, sqlite_url: str) -> None:
    gw = spawn_gateway(sqlite_url, "--metrics-public", "--metrics-user-label")
    SyncGatewayClient(gw.url, TOKENS["alice"]).submit("vision", "kernel", 2)
    status, text = scrape(gw.url, None)
    assert status == 200, text
    rows = device_labels(text)
    held = [r for r in rows if r["user"]]
    assert {r["user"] for r in held} == {"alice"} and len(held) == 2 * len(DEVICE_SERIES)
    assert {tuple(sorted(r)) for r in rows} == {LABELS}
    promtool_check(text)
    # public means public: a wrong token is not even looked at
    status, _ = scrape(gw.url, "not-a-token-at-all")
    assert status == 200


def test_metric_flags_have_help() -> None:
    from jupyter_gpuaas.gateway.app import GatewayApp

    app = GatewayApp()
    for trait in ("metrics_public", "metrics_user_label"):
        assert app.traits()[trait].help, trait
        assert app.traits()[trait].default_value is False
    assert {"metrics-public", "metrics-user-label"} <= set(app.flags)


@pytest.mark.parametrize("flag", ["--metrics-public", "--metrics-user-label"])
def test_metric_flags_parse(flag: str) -> None:
    from jupyter_gpuaas.gateway.app import GatewayApp

    app = GatewayApp()
    app.initialize([flag, "--tokens=x"])
    assert getattr(app, flag.lstrip("-").replace("-", "_")) is True
