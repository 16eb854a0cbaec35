"""The shipped dashboard and rules against the real thing: Debian's `prometheus`, started
on a loopback port with the rule file, scrapes a running gateway (a subprocess with
simulated devices) while users queue, hold, idle, get culled, preempted and lose a
lease; then every dashboard panel's query, every recording rule and every alert's signal
(its expression without the threshold, since a healthy gateway fires none) returns
series from Prometheus's HTTP API, with the dashboard's variables substituted."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gwutil import TOKENS, free_port
from helpers import stop, wait_for
from promutil import (
    ROOT,
    RULES,
    dashboard,
    dashboard_exprs,
    label_values,
    rules,
    signal,
    substitute,
)
from promutil import variable_queries as variables

from jupyter_gpuaas.client import SyncGatewayClient

pytestmark = pytest.mark.slow

QUOTAS: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 1, "gpus_per_node": 4}, "t4": {"nodes": 1, "gpus_per_node": 4}},
    "tenants": {
        # a100: more quota in the cohort (6) than GPUs (4), so a queued request can be
        # admissible by quota and blocked by capacity (a node short).
        "vision": {
            "cohort": "lab",
            "quota": {"a100": 4, "t4": 2},
            "preemption": {"reclaim_within_cohort": "Any"},
        },
        # nlp's idle kernel is never culled: it shows as idle GPUs.
        "nlp": {"cohort": "lab", "quota": {"a100": 2, "t4": 2}, "idle_timeout": 0},
    },
    "policy": {
        "idle_timeout": 1.0,
        "cull_warning": 0.5,
        "reservation_ttl": 600,
        "preemption_grace": 0,
        # A scaler that is asked for a100 nodes and never brings one (desired > ready).
        "autoscale": {"a100": {"max_nodes": 3, "provision": False}},
    },
}


def picture_script() -> Any:
    """scripts/dashboard_picture.py, which draws the README's picture of the dashboard
    (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "dashboard_picture", ROOT / "scripts" / "dashboard_picture.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not shutil.which(found):
        pytest.skip("prometheus missing: scripts/ensure-system-deps.sh installs Debian's")
    return found


class Prometheus:
    """A Prometheus server on a loopback port, its config and data in a temp dir."""

    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "jupyter-gpuaas",
                    "metrics_path": "/metrics",
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=tmp,
            )
        until(self._ready, 60, "Prometheus to be ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = self.url + "api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def stop(self) -> None:
        stop(self.proc, 10)


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_for(check, timeout, what, interval=0.2)


class Holders:
    """Heartbeats for the requests users hold (busy or idle), every 0.5 s, in a thread."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[SyncGatewayClient, bool]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def hold(self, c: SyncGatewayClient, rid: str, busy: bool) -> None:
        c.heartbeat(rid, busy)
        self.held[rid] = (c, busy)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for rid, (c, busy) in list(self.held.items()):
                try:
                    c.heartbeat(rid, busy)
                except Exception:  # ended (culled, preempted): nothing left to renew
                    self.held.pop(rid, None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def holders() -> Iterator[Holders]:
    h = Holders()
    yield h
    h.close()


def state(c: SyncGatewayClient, rid: str) -> str:
    return str(c.get(rid)["state"])


def test_dashboard_and_rules_return_series_from_a_real_prometheus(
    spawn_gateway: Any, sqlite_url: str, tmp_path: Path, holders: Holders
) -> None:
    gw = spawn_gateway(
        sqlite_url,
        "--metrics-public",
        "--lease-ttl=3",
        "--GatewayApp.sample_interval=0.5",
        "--GatewayApp.tick_interval=0.2",
        quotas=QUOTAS,
    )
    prom = Prometheus(tmp_path, urllib.parse.urlsplit(gw.url).netloc)
    try:
        alice = SyncGatewayClient(gw.url, TOKENS["alice"])
        bob = SyncGatewayClient(gw.url, TOKENS["bob"])
        until(lambda: prom.query('up{job="jupyter-gpuaas"} == 1'), 30, "the first scrape")

        # bob's kernel borrows vision's t4s; alice's job reclaims them (a preemption).
        borrower = bob.submit("nlp", "kernel", 4, flavor="t4")
        assert borrower["state"] == "admitted", borrower
        holders.hold(bob, borrower["id"], busy=True)
        reclaim = alice.submit("vision", "job", 2, flavor="t4")
        holders.hold(alice, reclaim["id"], busy=True)
        until(lambda: state(alice, reclaim["id"]) == "admitted", 20, "the reclaim")
        assert state(bob, borrower["id"]) == "preempted"
        # alice's idle kernel is culled and parked.
        idle = alice.submit("vision", "kernel", 1, flavor="a100")
        holders.hold(alice, idle["id"], busy=False)
        # alice's job whose holder never renews its lease.
        lost = alice.submit("vision", "job", 1, flavor="a100")
        assert lost["state"] == "admitted", lost
        # bob's idle kernel that nlp never culls; after a scrape, a second admission of
        # nlp's kernels, so the wait histogram has a rate.
        time.sleep(1.5)
        kept = bob.submit("nlp", "kernel", 1, flavor="a100")
        holders.hold(bob, kept["id"], busy=False)
        # alice's server waits: vision may take 4 a100s (with one borrowed), the node
        # has 3 free (one parked for her kernel, one bob's): a node short.
        queued = alice.submit("vision", "server", 4, flavor="a100")
        assert queued["state"] == "queued", queued
        until(lambda: state(alice, idle["id"]) == "parked", 20, "the cull")
        until(lambda: state(alice, lost["id"]) == "finished", 20, "the lease expiry")
        assert alice.get(lost["id"])["reason"] == "lease expired"

        # Prometheus has the gateway's view: the counters and the queue.
        for name in ("culled", "preempted", "lease_expired"):
            until(lambda n=name: prom.query(f"gpuaas_{n}_total"), 20, f"gpuaas_{name}_total")
        time.sleep(3)  # a few more scrapes and rule evaluations: rates need two samples
        pending = prom.query('gpuaas_pending_requests{tenant="vision",kind="server"}')
        assert [float(s["value"][1]) for s in pending] == [1.0]
        missing = prom.query('flavor:gpuaas_missing_nodes:sum{flavor="a100"}')
        assert [float(s["value"][1]) for s in missing] == [1.0]
        idle_gpus = prom.query("gpuaas_idle_gpus")
        assert {s["metric"]["tenant"]: float(s["value"][1]) for s in idle_gpus}["nlp"] == 1.0

        empty = []
        checked = 0
        for title, expr in dashboard_exprs():
            checked += 1
            if not prom.query(substitute(expr)):
                empty.append(f"panel {title!r}: {substitute(expr)}")
        for rule in rules():
            checked += 1
            if "record" in rule:
                found = prom.query(rule["record"]) and prom.query(rule["expr"])
                what = f"recording rule {rule['record']}"
                expr = rule["expr"]
            else:
                expr = signal(rule["expr"])
                assert expr != rule["expr"], f"{rule['alert']} has no threshold to strip"
                found = prom.query(expr)
                what = f"alert {rule['alert']}"
            if not found:
                empty.append(f"{what}: {expr}")
        for name, query in variables().items():
            checked += 1
            metric, label = label_values(query)
            values = {s["metric"].get(label) for s in prom.query(metric)}
            if not values - {None, ""}:
                empty.append(f"variable {name}: {query}")
        assert not empty, "no series for:\n" + "\n".join(empty)
        assert checked > 35

        # The per-tenant waits are numbers where a tenant's admissions have a rate.
        p95 = prom.query("tenant:gpuaas_admission_wait_seconds:p95_1h")
        values = {s["metric"]["tenant"]: float(s["value"][1]) for s in p95}
        assert "nlp" in values and math.isfinite(values["nlp"]) and values["nlp"] >= 0

        # The README's picture of the dashboard (scripts/dashboard_picture.py) sends the
        # panels' queries as ranges: each panel with queries gets series, and it draws them.
        picture = picture_script()
        end = time.time()
        drawn = picture.fetch_panels(
            prom.url, picture.read_panels(dashboard(), range_s=60), end - 60, end
        )
        assert len([p for p in drawn if p.queries]) == len({t for t, _ in dashboard_exprs()})
        blank = [p.title for p in drawn if p.queries and not p.series]
        assert not blank, f"no series drawn for {blank}"
        lines = [p for p in drawn if p.kind == "timeseries"]
        assert all(max(len(s.points) for s in p.series) > 1 for p in lines), "one point"
        assert "{{" not in " ".join(s.legend for p in drawn for s in p.series)
        png = tmp_path / "dashboard.png"
        picture.draw(drawn, png, "jupyter-gpuaas", "test")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        prom.stop()
        gw.stop()
