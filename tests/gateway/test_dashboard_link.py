"""The landing page links each tenant to its row of the Grafana dashboard, in Chromium:
the admin (and a viewer) see a link per tenant that opens the dashboard with
`var-tenant=NAME`; a plain user sees none, and a gateway without --grafana-url shows none.

Grafana itself is not run: a loopback HTTP server that records the paths it is asked for
stands in for it (what is tested is where the browser goes; the dashboard's own queries
are tested against a real Prometheus in test_prometheus_live.py). A token in the header
stands in for the Hub login, as in test_pages.py (the Hub's OAuth walk is tests/hub/).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from gwutil import TOKENS
from helpers import new_page

pytestmark = pytest.mark.slow


class Grafana:
    """Answers every GET with a page, and remembers the paths asked for."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                body = b"<html><title>Grafana stand-in</title></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def grafana() -> Iterator[Grafana]:
    g = Grafana()
    yield g
    g.close()


def landing(browser: Any, url: str, who: str) -> Any:
    auth = {"Authorization": f"token {TOKENS[who]}"}
    page = new_page(browser, 1280, 1000, 20_000, extra_http_headers=auth)
    page.goto(url)
    page.locator("#whoami").wait_for()
    assert page.inner_text("#whoami") == who
    return page


def test_admin_page_links_each_tenant_to_its_dashboard_row(
    spawn_gateway: Any, sqlite_url: str, grafana: Grafana, browser: Any
) -> None:
    dashboard = f"{grafana.url}/d/jupyter-gpuaas/jupyter-gpuaas?orgId=1"
    gw = spawn_gateway(sqlite_url, f"--grafana-url={dashboard}")

    admin = landing(browser, gw.url, "root")
    links = admin.locator("#tenants h3 a.dashboard")
    hrefs = {
        links.nth(i).evaluate("a => a.closest('h3').id"): links.nth(i).get_attribute("href")
        for i in range(links.count())
    }
    assert hrefs == {
        "tenant-vision": f"{dashboard}&var-tenant=vision",
        "tenant-nlp": f"{dashboard}&var-tenant=nlp",
    }
    admin.locator("#tenant-vision a.dashboard").click()
    admin.wait_for_url(f"{dashboard}&var-tenant=vision")
    pages = [path for path in grafana.seen if path != "/favicon.ico"]  # the browser's own
    assert pages == ["/d/jupyter-gpuaas/jupyter-gpuaas?orgId=1&var-tenant=vision"]

    viewer = landing(browser, gw.url, "carol")  # may view the whole queue
    assert viewer.locator("#tenants h3 a.dashboard").count() == 2
    user = landing(browser, gw.url, "alice")  # her own requests only
    assert user.locator("#tenants h3").count() == 2
    assert user.locator("#tenants h3 a.dashboard").count() == 0


def test_no_links_without_a_grafana_url(spawn_gateway: Any, sqlite_url: str, browser: Any) -> None:
    gw = spawn_gateway(sqlite_url)
    admin = landing(browser, gw.url, "root")
    assert admin.locator("#tenants h3").count() == 2
    assert admin.locator("a.dashboard").count() == 0
