"""The shipped Grafana dashboard and Prometheus rules, read for the tests: their
expressions, the metric names they use, and the dashboard's variables substituted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
# hub_config/ at the root (jupyter_gpuaas/hub_config links to it, so the wheel ships it);
# the package's own copy where the link goes the other way.
HUB_CONFIG = next(
    p
    for p in (ROOT / "hub_config", ROOT / "jupyter_gpuaas" / "hub_config")
    if (p / "grafana").is_dir()
)
PROM = HUB_CONFIG / "prometheus"
RULES = PROM / "jupyter-gpuaas.rules.yml"
RULE_TESTS = PROM / "jupyter-gpuaas.rules.test.yml"
PROMETHEUS_RULE = PROM / "prometheusrule.yaml"
SERVICE_MONITOR = PROM / "servicemonitor.yaml"
DASHBOARD = HUB_CONFIG / "grafana" / "jupyter-gpuaas.json"

# Series Prometheus makes itself, not the gateway.
PROMETHEUS_OWN = {"up"}

# PromQL words that look like names but are not metrics.
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}  # fmt: skip


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard."""
    return [
        (p["title"], t["expr"])
        for p in panels(dashboard())
        for t in p.get("targets", [])
        if t.get("expr")
    ]


def variable_queries() -> dict[str, str]:
    """The query of each query variable (`label_values(metric, label)`)."""
    out = {}
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]
            out[v["name"]] = q["query"] if isinstance(q, dict) else q
    return out


def label_values(query: str) -> tuple[str, str]:
    """(metric, label) of a variable's `label_values(metric{...}, label)`."""
    m = re.fullmatch(
        r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s*,\s*(\w+)\s*\)", query
    )
    assert m, query
    return m.group(1), m.group(2)


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"]]


def substitute(expr: str, range_s: int = 3600) -> str:
    """The expression as Grafana sends it, with every tenant and flavor (All)."""
    out = expr.replace("$__range_s", str(range_s)).replace("$__range", f"{range_s}s")
    out = out.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return out.replace("$tenant", ".*").replace("$flavor", ".*")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (recording rules' names included)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', substitute(expr))  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # label lists
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        after = text[m.end() :].lstrip()
        if after.startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function or an operator
        if text[m.start() - 1 : m.start()].isdigit():
            continue  # a number's exponent or unit
        names.add(word)
    return names


def signal(expr: str) -> str:
    """An alert's expression without its threshold: what must return series on a
    healthy gateway (the alert itself fires only when something is wrong)."""
    return re.sub(r"\s*(>=|<=|==|!=|>|<)\s*[0-9.e+]+\s*$", "", expr.strip())
