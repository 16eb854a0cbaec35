"""Draw the shipped Grafana dashboard from a real Prometheus, without Grafana.

There is no Grafana on the build host (Debian does not package it), so the README's
picture of the dashboard is drawn here: every panel of hub_config/grafana/jupyter-gpuaas.json
is laid out on the dashboard's own 24-column grid with its own title, each of its PromQL
queries is sent to a Prometheus's HTTP API (`query_range` for a time series, an instant
`query` for a stat) with the dashboard's variables substituted, and the series that come
back are drawn with matplotlib, named by the query's `legendFormat`. It is a rendering of
the same queries, not a Grafana screenshot: colours, units and axes are matplotlib's.

    scripts/dashboard_picture.py --prometheus http://127.0.0.1:9090/ --minutes 10 out.png
    scripts/dashboard_picture.py --demo 240 docs/dashboard.png

`--demo SECONDS` starts what the picture needs first: a gateway (simulated devices, a
SQLite store in a temp dir), Debian's `prometheus` scraping it every second with the
shipped rules, and a few users who submit kernels, servers and jobs, hold them busy or
idle (culled), cancel some and let one lease lapse, for that many seconds; then it draws
the whole run. tests/gateway/test_prometheus_live.py runs `fetch_panels` against its own
live Prometheus, so the queries here cannot silently break.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "hub_config" / "grafana" / "jupyter-gpuaas.json"
RULES = ROOT / "hub_config" / "prometheus" / "jupyter-gpuaas.rules.yml"
DAY = 86400.0
#: Points per time series panel (the range query's step is the window over this).
POINTS = 120


@dataclass
class Series:
    """One line of a panel: its legend and its (unix time, value) points."""

    legend: str
    points: list[tuple[float, float]]


@dataclass
class Panel:
    """A panel as the dashboard lays it out, and what its queries returned."""

    title: str
    kind: str  # "row", "stat" or "timeseries"
    grid: Mapping[str, int]  # Grafana's gridPos: x, y, w, h in grid units
    queries: list[tuple[str, str]]  # (PromQL as sent, legendFormat)
    series: list[Series] = field(default_factory=list)


def substitute(expr: str, tenant: str, flavor: str, range_s: int) -> str:
    """A panel's expression as Grafana would send it: `$tenant` and `$flavor` as regular
    expressions (".*" for All), `$__range` as the dashboard's time range."""
    out = expr.replace("$__range_s", str(range_s)).replace("$__range", f"{range_s}s")
    out = out.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return out.replace("$tenant", tenant).replace("$flavor", flavor)


def read_panels(
    dashboard: Mapping[str, Any], tenant: str = ".*", flavor: str = ".*", range_s: int = 3600
) -> list[Panel]:
    """Every panel of `dashboard` (those inside collapsed rows too), in grid order, its
    queries substituted; a row's title names the tenant drawn."""
    out = []
    shown = "all" if tenant == ".*" else tenant
    for p in _all_panels(dashboard["panels"]):
        title = str(p.get("title", "")).replace("$tenant", shown).replace("$flavor", flavor)
        queries = [
            (substitute(t["expr"], tenant, flavor, range_s), str(t.get("legendFormat", "")))
            for t in p.get("targets", [])
            if t.get("expr")
        ]
        out.append(Panel(title, str(p.get("type")), p["gridPos"], queries))
    out.sort(key=lambda p: (p.grid["y"], p.grid["x"]))
    return out


def _all_panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for p in panels:
        yield p
        yield from p.get("panels", [])


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """Grafana's legendFormat: `{{label}}` replaced by the series' label."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def _get(prometheus: str, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
    url = prometheus.rstrip("/") + "/api/v1/" + path + "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params.get('query')}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def fetch_panels(prometheus: str, panels: list[Panel], start: float, end: float) -> list[Panel]:
    """Each panel's series from the Prometheus at `prometheus`: a time series panel's over
    [start, end] (`query_range`, `POINTS` points), a stat's value at `end`."""
    step = max(1.0, (end - start) / POINTS)
    for panel in panels:
        panel.series = []
        for expr, fmt in panel.queries:
            if panel.kind == "timeseries":
                found = _get(
                    prometheus,
                    "query_range",
                    {"query": expr, "start": str(start), "end": str(end), "step": str(step)},
                )
                for s in found:
                    pts = [(float(t), float(v)) for t, v in s["values"]]
                    panel.series.append(Series(legend(fmt, s["metric"]) or expr, pts))
            else:
                for s in _get(prometheus, "query", {"query": expr, "time": str(end)}):
                    t, v = s["value"]
                    panel.series.append(Series(legend(fmt, s["metric"]), [(float(t), float(v))]))
    return panels


def draw(panels: list[Panel], out: Path, title: str, note: str) -> None:
    """The panels on the dashboard's grid (24 columns; a grid unit is 30 px tall in
    Grafana, drawn at the same aspect), written to `out` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from datetime import timezone

    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = max(p.grid["y"] + p.grid["h"] for p in panels)
    width_in = 13.0
    unit_w = width_in / 24
    unit_h = unit_w * 0.55
    top_in = 0.55
    height_in = rows * unit_h + top_in + 0.25
    fig = plt.figure(figsize=(width_in, height_in), dpi=72)
    fig.patch.set_facecolor("#111217")
    fig.text(0.01, 1 - 0.2 / height_in, title, color="white", fontsize=13, va="top", weight="bold")
    fig.text(0.99, 1 - 0.22 / height_in, note, color="#9fa7b3", fontsize=8, va="top", ha="right")
    # Matplotlib's dates are days since 1970-01-01: a unix time over 86,400.
    fmt = mdates.DateFormatter("%H:%M", tz=timezone.utc)  # type: ignore[no-untyped-call]
    times = [t / DAY for p in panels for s in p.series for t, _ in s.points]
    span = (min(times), max(times)) if times else None
    for p in panels:
        g = p.grid
        pad = 0.05
        x0 = g["x"] * unit_w + pad  # the panel's box, in inches from the top left
        y0 = top_in + g["y"] * unit_h + pad
        pw = g["w"] * unit_w - 2 * pad
        ph = g["h"] * unit_h - 2 * pad
        if p.kind == "row":
            fig.text(
                x0 / width_in,
                1 - (y0 + ph / 2) / height_in,
                p.title,
                color="#d8d9da",
                fontsize=11,
                weight="bold",
                va="center",
            )
            continue
        fig.patches.append(
            Rectangle(
                (x0 / width_in, 1 - (y0 + ph) / height_in),
                pw / width_in,
                ph / height_in,
                transform=fig.transFigure,
                facecolor="#181b1f",
                edgecolor="#2c3235",
                zorder=-1,
            )
        )
        fig.text(
            (x0 + 0.08) / width_in,
            1 - (y0 + 0.06) / height_in,
            p.title,
            color="#d8d9da",
            fontsize=9,
            va="top",
        )
        inner = (0.12, 0.28) if p.kind == "stat" else (0.5, 0.3)  # left, bottom margins
        ax = fig.add_axes(
            (
                (x0 + inner[0]) / width_in,
                1 - (y0 + ph - inner[1]) / height_in,
                (pw - inner[0] - 0.12) / width_in,
                (ph - inner[1] - 0.3) / height_in,
            )
        )
        ax.set_facecolor("#181b1f")
        for spine in ax.spines.values():
            spine.set_visible(p.kind != "stat")
            spine.set_color("#2c3235")
        ax.tick_params(colors="#9fa7b3", labelsize=7)
        if p.kind == "stat":
            ax.set_xticks([])
            ax.set_yticks([])
            text = ", ".join(_number(s.points[-1][1]) for s in p.series) or "No data"
            ax.text(
                0.5,
                0.5,
                text,
                color="#73bf69",
                fontsize=20 if p.grid["h"] < 6 else 26,
                ha="center",
                va="center",
                weight="bold",
                transform=ax.transAxes,
            )
            continue
        if not p.series:
            ax.text(
                0.5,
                0.5,
                "No data",
                color="#9fa7b3",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
        for s in p.series[:8]:  # a legend of more would hide the lines
            xs = [t / DAY for t, _ in s.points]
            ax.plot(xs, [v for _, v in s.points], linewidth=1.2, label=s.legend)
        values = [v for s in p.series[:8] for _, v in s.points if v == v]
        if values:  # room above the lines for the legend
            lo, hi = min(0.0, min(values)), max(values)
            ax.set_ylim(lo, hi + max(1.0, hi - lo) * 0.5)
        ax.xaxis.set_major_formatter(fmt)
        if span is not None and span[0] < span[1]:
            ax.set_xlim(*span)
            minutes = (span[1] - span[0]) * DAY / 60
            every = next((m for m in (1, 2, 5, 10, 15, 30) if minutes / m <= 6), 0)
            ax.xaxis.set_major_locator(
                mdates.MinuteLocator(byminute=range(0, 60, every))  # type: ignore[no-untyped-call]
                if every
                else mdates.AutoDateLocator(maxticks=6)  # type: ignore[no-untyped-call]
            )
        ax.grid(color="#2c3235", linewidth=0.5)
        if p.series:
            leg = ax.legend(
                fontsize=6.5,
                loc="upper left",
                frameon=False,
                ncol=2,
                labelcolor="#c7d0d9",
                handlelength=1.2,
            )
            leg.set_in_layout(False)
    fig.savefig(out, facecolor=fig.get_facecolor())
    plt.close(fig)
    _shrink(out)


def _number(v: float) -> str:
    if v != v:  # NaN
        return "n/a"
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.2f}"


def _shrink(out: Path) -> None:
    """Down to 256 colours (the README wants a small picture); skipped without Pillow."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(out) as im:
        small = im.convert("RGB").quantize(colors=128)
    small.save(out, optimize=True)


# --- the demo: a gateway, a Prometheus scraping it, and users doing things ---------

QUOTAS: dict[str, Any] = {
    "flavors": {"a100": {"nodes": 2, "gpus_per_node": 4}, "t4": {"nodes": 1, "gpus_per_node": 4}},
    "tenants": {
        "vision": {
            "cohort": "lab",
            "quota": {"a100": 4, "t4": 2},
            "preemption": {"reclaim_within_cohort": "Any"},
        },
        "nlp": {"cohort": "lab", "quota": {"a100": 4, "t4": 2}},
    },
    "policy": {
        "idle_timeout": 20.0,
        "cull_warning": 5.0,
        "reservation_ttl": 30,
        "preemption_grace": 0,
        "autoscale": {"a100": {"max_nodes": 3, "provision": False}},
    },
}
USERS = {"alice": "vision", "erin": "vision", "bob": "nlp", "dan": "nlp"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer within {timeout:.0f} s")


def _users(url: str, seconds: float, tokens: Mapping[str, str], seed: int = 1) -> None:
    """Users submitting, holding (busy or idle: idle ones are culled), releasing and, once,
    letting a lease lapse, for `seconds`."""
    from jupyter_gpuaas.client import SyncGatewayClient

    rnd = random.Random(seed)
    clients = {u: SyncGatewayClient(url, tokens[u]) for u in USERS}
    held: dict[str, tuple[str, bool, float]] = {}  # id: (user, busy, release at)
    lapse = None
    end = time.monotonic() + seconds
    next_submit = 0.0
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_submit:
            user = rnd.choice(list(USERS))
            kind = rnd.choice(("kernel", "kernel", "server", "job"))
            flavor = rnd.choice(("a100", "a100", "t4"))
            try:
                r = clients[user].submit(USERS[user], kind, rnd.choice((1, 1, 2, 4)), flavor=flavor)
                busy = kind == "job" or rnd.random() < 0.7
                held[r["id"]] = (user, busy, now + rnd.uniform(30, 120))
                if lapse is None and kind == "job" and now > end - seconds / 2:
                    lapse = r["id"]
            except Exception as exc:  # a refusal is part of the traffic
                print(f"submit refused: {exc}", file=sys.stderr)
            next_submit = now + rnd.expovariate(1 / 2.5)
        for rid, (user, busy, until) in list(held.items()):
            c = clients[user]
            try:
                if now >= until:
                    c.cancel(rid)
                    del held[rid]
                elif rid != lapse:
                    c.heartbeat(rid, busy)
            except Exception:  # queued (no lease yet), or ended (culled, preempted)
                try:
                    if c.get(rid)["state"] not in ("queued", "admitted"):
                        del held[rid]
                except Exception:
                    del held[rid]
        time.sleep(1.0)


def demo(seconds: float, out: Path, tenant: str) -> None:
    """A gateway and a Prometheus in a temp dir, `seconds` of users, then the picture."""
    import yaml

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus missing: scripts/ensure-system-deps.sh installs Debian's")
    tokens = {u: f"{u}-demo-token-{i:04d}" for i, u in enumerate(USERS)}
    with tempfile.TemporaryDirectory(prefix="gpuaas-dash-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "quotas.yaml").write_text(yaml.safe_dump(QUOTAS))
        (tmp / "tokens.yaml").write_text(
            yaml.safe_dump(
                {"tokens": {tokens[u]: {"user": u, "groups": [t]} for u, t in USERS.items()}}
            )
        )
        gw_port, prom_port = _free_port(), _free_port()
        gw_url = f"http://127.0.0.1:{gw_port}/"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with open(tmp / "gateway.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "jupyter_gpuaas.gateway.app",
                            "--ip=127.0.0.1",
                            f"--port={gw_port}",
                            f"--quotas={tmp / 'quotas.yaml'}",
                            f"--tokens={tmp / 'tokens.yaml'}",
                            "--devices=simulated:a100=2x4,t4=1x4",
                            f"--db-url=sqlite:///{tmp / 'gpuaas.sqlite'}",
                            "--metrics-public",
                            "--lease-ttl=5",
                            "--GatewayApp.sample_interval=1",
                            "--GatewayApp.tick_interval=0.2",
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=tmp,
                    )
                )
            _wait(gw_url + "api/openapi.json", procs[0], "the gateway")
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "jupyter-gpuaas",
                        "metrics_path": "/metrics",
                        "static_configs": [{"targets": [f"127.0.0.1:{gw_port}"]}],
                    }
                ],
            }
            (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
            with open(tmp / "prometheus.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            prometheus,
                            f"--config.file={tmp / 'prometheus.yml'}",
                            f"--storage.tsdb.path={tmp / 'data'}",
                            f"--web.listen-address=127.0.0.1:{prom_port}",
                            "--log.level=warn",
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=tmp,
                    )
                )
            prom_url = f"http://127.0.0.1:{prom_port}/"
            _wait(prom_url + "-/ready", procs[1], "prometheus")
            start = time.time()
            _users(gw_url, seconds, tokens)
            time.sleep(3)  # the last scrapes and rule evaluations
            end = time.time()
            render(prom_url, out, start, end, tenant)
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


def render(prometheus: str, out: Path, start: float, end: float, tenant: str = ".*") -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = read_panels(dash, tenant=tenant, range_s=max(60, int(end - start)))
    fetch_panels(prometheus, panels, start, end)
    minutes = (end - start) / 60
    draw(
        panels,
        out,
        str(dash.get("title", "jupyter-gpuaas")),
        f"drawn by scripts/dashboard_picture.py from a real Prometheus ({minutes:.0f} min "
        "of a demo gateway with simulated devices); not a Grafana screenshot",
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("--prometheus", help="a Prometheus that scrapes a gateway (its base URL)")
    ap.add_argument("--minutes", type=float, default=60.0, help="the window drawn, to now")
    ap.add_argument(
        "--demo",
        type=float,
        metavar="SECONDS",
        help="start a gateway, a Prometheus and users for SECONDS first",
    )
    ap.add_argument("--tenant", default="vision", help="the tenant whose row is drawn")
    args = ap.parse_args(argv)
    if args.demo:
        demo(args.demo, args.out, re.escape(args.tenant))
    elif args.prometheus:
        end = time.time()
        render(args.prometheus, args.out, end - args.minutes * 60, end, re.escape(args.tenant))
    else:
        ap.error("give --prometheus URL or --demo SECONDS")
    print(f"{args.out}: {args.out.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
