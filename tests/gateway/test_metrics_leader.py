"""`GET metrics` of two gateways on one PostgreSQL store (leader.py): real processes.

Prometheus scrapes every replica. The leader exports `gpuaas_leader 1` and the queue's,
quotas' and devices' gauges; the standby, whose mirror holds the same queue, exports
`gpuaas_leader 0` and none of them, so a sum over the pods counts the queue once. When
the leader is killed the new leader exports them, from the restored store.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from gwutil import QUOTAS, TOKENS, GatewayProcess, call, free_port, fresh_pg_database
from prometheus_client.parser import text_string_to_metric_families
from test_leader import INTERVAL, health
from test_metrics_auth import promtool_check, scrape
from test_store_faults import wait_until

from jupyter_gpuaas.kubeapi.meta import Settings
from jupyter_gpuaas.kubeapi.scaleup import nodes_wanted_query
from jupyter_gpuaas.kubernetes.monitoring import scrape_config

pytestmark = pytest.mark.slow

# The gauges a standby would double: the queue, quotas, nodes and devices.
STATE_GAUGES = (
    "gpuaas_pending_requests",
    "gpuaas_pending_gpus",
    "gpuaas_admitted_gpus",
    "gpuaas_quota_gpus",
    "gpuaas_borrowed_gpus",
    "gpuaas_parked_gpus",
    "gpuaas_desired_nodes",
    "gpuaas_nodes",
    "gpuaas_device_utilization_ratio",
    "gpuaas_device_healthy",
)


def series(url: str) -> tuple[dict[str, list[tuple[dict[str, str], float]]], str]:
    """Each family's samples as (labels, value), and the raw text, scraped with view."""
    status, text = scrape(url, "carol")
    assert status == 200, text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(dict(s.labels), s.value) for s in family.samples]
    return out, text


def total(families: dict[str, list[tuple[dict[str, str], float]]], name: str, **want: str) -> float:
    return sum(
        v
        for labels, v in families.get(name, [])
        if all(labels.get(k) == x for k, x in want.items())
    )


def test_the_standby_exports_gpuaas_leader_0_and_no_queue_gauges(
    spawn_gateway: Callable[..., GatewayProcess], postgres_url: str
) -> None:
    db_url = fresh_pg_database(postgres_url)
    a = spawn_gateway(db_url, INTERVAL, "--lease-ttl=600")
    b = spawn_gateway(db_url, INTERVAL, "--lease-ttl=600")
    assert health(a.url)["leader"] is True and health(b.url)["leader"] is False

    # vision takes the four a100; nlp's one waits for capacity: admitted and pending series.
    status, held, _ = call(
        a.url, "POST", "api/requests", {"tenant": "vision", "kind": "job", "gpus": 4}
    )
    assert status == 201 and held["state"] == "admitted", held
    status, queued, _ = call(
        a.url, "POST", "api/requests", {"tenant": "nlp", "kind": "kernel", "gpus": 1}, who="bob"
    )
    assert status == 201 and queued["state"] == "queued", queued
    # The standby's mirror has both (so what it leaves out, it leaves out on purpose).
    wait_until(
        lambda: (
            {r["id"] for r in call(b.url, "GET", "api/requests", who="root")[1]}
            >= {held["id"], queued["id"]}
        ),
        10,
        "the standby lists the leader's requests",
    )

    lead, lead_text = series(a.url)
    standby, standby_text = series(b.url)
    assert lead["gpuaas_leader"] == [({}, 1.0)]
    assert standby["gpuaas_leader"] == [({}, 0.0)]
    assert total(lead, "gpuaas_admitted_gpus", tenant="vision", flavor="a100") == 4
    assert total(lead, "gpuaas_pending_requests", tenant="nlp", flavor="a100") == 1
    assert lead["gpuaas_device_healthy"]
    for name in STATE_GAUGES:
        assert standby.get(name, []) == [], (name, standby[name])
    # What a dashboard's sum over both pods reads: the leader's numbers, once.
    both = {n: lead.get(n, []) + standby.get(n, []) for n in set(lead) | set(standby)}
    assert total(both, "gpuaas_admitted_gpus", tenant="vision") == 4
    assert total(both, "gpuaas_pending_requests") == 1
    assert total(both, "gpuaas_quota_gpus", tenant="nlp", flavor="a100") == 2
    assert total(both, "gpuaas_leader") == 1
    promtool_check(lead_text)
    promtool_check(standby_text)

    # The leader dies: the standby takes over and exports the restored queue itself.
    a.kill()
    wait_until(lambda: health(b.url).get("leader") is True, 15, "the standby takes over")
    after, after_text = series(b.url)
    assert after["gpuaas_leader"] == [({}, 1.0)]
    assert total(after, "gpuaas_admitted_gpus", tenant="vision", flavor="a100") == 4
    assert total(after, "gpuaas_pending_requests", tenant="nlp", flavor="a100") == 1
    promtool_check(after_text)


def test_a_single_gateway_is_the_leader_in_its_metrics(
    spawn_gateway: Callable[..., GatewayProcess], sqlite_url: str
) -> None:
    gw = spawn_gateway(sqlite_url)
    families, text = series(gw.url)
    assert families["gpuaas_leader"] == [({}, 1.0)]
    promtool_check(text)


def test_the_leader_gauge_is_declared_on_a_standby_snapshot() -> None:
    """In-process: the families stay declared (HELP/TYPE) without series on a standby."""
    from jupyter_gpuaas.gateway.metrics import GatewayMetrics, TenantUsage

    m = GatewayMetrics()
    usage = [TenantUsage("vision", "a100", 4, 4, 0, 0, 0)]
    m.set_snapshot(usage, [], {"a100": 2}, {}, [], simulated=True, nodes={"a100": 1}, leader=False)
    text = m.render()[0].decode()
    assert "gpuaas_leader 0.0" in text and "# TYPE gpuaas_admitted_gpus gauge" in text
    assert "gpuaas_admitted_gpus{" not in text and "gpuaas_desired_nodes{" not in text
    assert "gpuaas_devices_simulated 1.0" in text
    m.set_snapshot(usage, [], {"a100": 2}, {}, [], nodes={"a100": 1})
    text = m.render()[0].decode()
    assert "gpuaas_leader 1.0" in text and 'gpuaas_desired_nodes{flavor="a100"} 2.0' in text
    promtool_check(text)


def prometheus_query(base: str, query: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as resp:
        answer = json.loads(resp.read())
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus package")
def test_prometheus_scrapes_both_replicas_with_the_token_file(
    spawn_gateway: Callable[..., GatewayProcess], postgres_url: str, tmp_path: Path
) -> None:
    """A real Prometheus runs the manifests' scrape job (its token file, its path rule)
    against a leader and a standby; KEDA's query and a sum over the pods read the
    leader's numbers once. Debian's Prometheus has no Kubernetes discovery, so the job's
    pod discovery and its relabelling by pod labels become the two static targets."""
    quotas = {**QUOTAS, "policy": {"autoscale": {"a100": {"max_nodes": 3, "provision": False}}}}
    db_url = fresh_pg_database(postgres_url)
    a = spawn_gateway(db_url, INTERVAL, "--lease-ttl=600", quotas=quotas)
    b = spawn_gateway(db_url, INTERVAL, "--lease-ttl=600", quotas=quotas)
    assert health(b.url)["leader"] is False
    for who, tenant, gpus in (("alice", "vision", 4), ("bob", "nlp", 1)):
        status, body, _ = call(
            a.url, "POST", "api/requests", {"tenant": tenant, "kind": "job", "gpus": gpus}, who
        )
        assert status == 201, body

    token = tmp_path / "metrics-token"
    token.write_text(TOKENS["carol"] + "\n")  # view scope, as the gpuaas-metrics service
    job = scrape_config(Settings(namespace="lab"))
    assert job["authorization"]["credentials_file"].endswith("/token")
    assert job["metrics_path"] == "/services/gpuaas/metrics"
    job.pop("kubernetes_sd_configs")
    job.pop("relabel_configs")
    targets = [urllib.parse.urlsplit(gp.url).netloc for gp in (a, b)]
    job.update(
        metrics_path="/metrics",  # the test gateways' base URL is /
        scrape_interval="1s",
        static_configs=[{"targets": targets}],
        authorization={**job["authorization"], "credentials_file": str(token)},
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    check = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "prometheus.log", "wb") as log:
        prom = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def both_up() -> bool:
            try:
                up = prometheus_query(base, "up")
            except OSError:
                return False
            return len(up) == 2 and all(r["value"][1] == "1" for r in up)

        wait_until(both_up, 60, "Prometheus scrapes both gateways with the token")
        wait_until(
            lambda: len(prometheus_query(base, "gpuaas_admitted_gpus")) > 0,
            30,
            "the leader's gauges in Prometheus",
        )
        leaders = {
            r["metric"]["instance"]: r["value"][1] for r in prometheus_query(base, "gpuaas_leader")
        }
        assert leaders == {targets[0]: "1", targets[1]: "0"}
        (admitted,) = prometheus_query(base, 'sum(gpuaas_admitted_gpus{tenant="vision"})')
        assert admitted["value"][1] == "4"  # not 8: the standby's mirror is not exported
        (queued,) = prometheus_query(base, "sum(gpuaas_pending_requests)")
        assert queued["value"][1] == "1"
        # KEDA's trigger: nlp's queued a100 needs one more node than the pool has.
        (wanted,) = prometheus_query(base, nodes_wanted_query("a100"))
        assert wanted["value"][1] == "1", wanted
    finally:
        prom.terminate()
        prom.wait(30)
