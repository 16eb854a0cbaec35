"""The shipped Prometheus rules and Grafana dashboard, checked without a server:
`promtool check rules` and `promtool test rules` pass, the operator's PrometheusRule holds
the same groups as the rule file, the ServiceMonitor finds the gateway's Service with the
scrape token, and every metric a panel or rule names is one the gateway exports
(test_prometheus_live.py runs them against a real Prometheus scraping a real gateway)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from promutil import (
    PROMETHEUS_OWN,
    PROMETHEUS_RULE,
    RULE_TESTS,
    RULES,
    SERVICE_MONITOR,
    dashboard,
    dashboard_exprs,
    label_values,
    metric_names,
    panels,
    rules,
    variable_queries,
)

from jupyter_gpuaas.devices import DeviceInfo, DeviceSample
from jupyter_gpuaas.gateway.metrics import GatewayMetrics, PendingCount, TenantUsage
from jupyter_gpuaas.kubeapi.meta import Settings
from jupyter_gpuaas.kubernetes import manifests, monitoring


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool") or "/usr/bin/promtool"
    if not shutil.which(tool):
        pytest.skip("promtool missing: scripts/ensure-system-deps.sh installs Debian's prometheus")
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent
    )


def exported_names() -> set[str]:
    """Every sample name a gateway exports, with every family filled."""
    m = GatewayMetrics(
        devices=lambda: [DeviceInfo("a100-0", 0, "a100", "NVIDIA A100", "GPU-a", 2**30)]
    )
    m.set_snapshot(
        [TenantUsage("vision", "a100", 4, 1, 1, 0, 1)],
        [PendingCount("vision", "a100", "job", 1)],
        {"a100": 2},
        {"vision": 1},
        [(DeviceSample("a100-0", 0, 0.5, 1, 40.0, 90.0, True), "a100", "vision", "ann")],
        simulated=False,
        nodes={"a100": 1},
    )
    m.observe_wait("vision", "job", 3.0)
    m.inc_culled("vision", "kernel")
    m.inc_preempted("vision", "job")
    m.inc_lease_expired("vision", "kernel")
    body, _ = m.render()
    return {s.name for f in text_string_to_metric_families(body.decode()) for s in f.samples}


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    # Every alert is tested firing and every recording rule for its value.
    tested = RULE_TESTS.read_text()
    for rule in rules():
        assert (rule.get("alert") or rule["record"]) in tested, rule


def test_the_prometheus_rule_holds_the_rule_files_groups() -> None:
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], (
        "prometheusrule.yaml drifted from jupyter-gpuaas.rules.yml: copy the rule file's "
        "groups into its spec.groups"
    )


def test_the_service_monitor_scrapes_the_gateway_service_with_its_token() -> None:
    doc = yaml.safe_load(SERVICE_MONITOR.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    service = manifests.service(Settings())
    selector = doc["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = doc["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == monitoring.METRICS_PATH
    # The same Secret (and key) the scrape job of `kubernetes manifests` mounts.
    secret = endpoint["authorization"]["credentials"]
    assert monitoring.TOKEN_DIR.endswith("/" + secret["name"]) and secret["key"] == "token"
    # The alerts' `up{job=~"jupyter-gpuaas.*"}` matches the job (the Service's name).
    assert service["metadata"]["name"].startswith("jupyter-gpuaas")


def test_every_metric_a_panel_or_rule_names_is_exported() -> None:
    exported = exported_names()
    recorded = {r["record"] for r in rules() if "record" in r}
    exprs = dashboard_exprs() + [(r.get("alert") or r["record"], r["expr"]) for r in rules()]
    assert len(exprs) > 30
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, (where, expr)
        unknown = names - exported - recorded - PROMETHEUS_OWN
        assert not unknown, f"{where}: {sorted(unknown)} are not exported ({expr})"


def test_the_variables_read_exported_labels() -> None:
    m = GatewayMetrics()
    m.set_snapshot(
        [TenantUsage("vision", "a100", 4, 1, 1, 0, 1)], [], {"a100": 2}, {}, [], nodes={"a100": 1}
    )
    body, _ = m.render()
    labels = {
        s.name: set(s.labels)
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }
    queries = variable_queries()
    assert queries.keys() == {"tenant", "flavor"}
    for name, query in queries.items():
        metric, label = label_values(query)
        assert label == name and label in labels[metric], query


def test_metric_names_are_found_in_expressions() -> None:
    """The name extraction the test above relies on (a wrong one would pass anything)."""
    assert metric_names(
        'histogram_quantile(0.95, sum by (le) (rate(x_bucket{tenant=~"$tenant"}[1h])))'
    ) == {"x_bucket"}
    assert metric_names("a / on(UUID) group_left(tenant) b > 3") == {"a", "b"}
    assert metric_names('count(c{f=~"$flavor"} == 0) or vector(0)') == {"c"}
    assert metric_names("sum(avg_over_time(d[$__range])) * $__range_s / 3600") == {"d"}


def test_the_dashboard_has_a_row_per_tenant_and_the_variables() -> None:
    dash = dashboard()
    assert dash["uid"] == "jupyter-gpuaas"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert {"datasource", "tenant", "flavor"} <= variables.keys()
    for name in ("tenant", "flavor"):
        assert variables[name]["multi"] and variables[name]["includeAll"]
    # The admin page's link `?var-tenant=NAME` shows that tenant's row.
    rows = [p for p in panels(dash) if p["type"] == "row" and p.get("repeat") == "tenant"]
    assert len(rows) == 1
    titles = {p["title"] for p in panels(dash)}
    for wanted in (
        "GPUs in use against quota",
        "Borrowed and parked GPUs",
        "Queued requests by kind",
        "Wait to start (last hour)",
        "Idle allocated GPU-hours",
        "Nodes: desired against ready",
        "Utilization",
        "Memory in use",
        "Temperature",
        "Power",
        "Culled per tenant (per hour)",
        "Preempted per tenant (per hour)",
    ):
        assert wanted in titles, wanted
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))
    for p in panels(dash):
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
