"""`metrics` through the Hub's PUBLIC proxy, as an outsider and as a scraper would reach it.

The issue: the device series carried user names and anyone could read them through the
proxy. Now an anonymous scrape is refused, a user's own token is not enough (403), and a
scraper with the view scope (the `tester` service's token) reads series whose `user`
label is empty while alice holds a GPU.
"""

from __future__ import annotations

import pytest
import requests
from hubutil import Hub
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow


def test_metrics_through_the_proxy_need_view_and_name_nobody(clean_hub: Hub) -> None:
    hub = clean_hub
    assert hub.spawn("alice", {"tenant": "vision", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("alice")
    url = f"{hub.url}/services/gpuaas/metrics"  # the public proxy, not the service port

    anonymous = requests.get(url, timeout=10, allow_redirects=False)
    assert anonymous.status_code == 401, anonymous.text
    assert "alice" not in anonymous.text

    # What alice's notebook holds (her server's token, with custom:gpuaas:use) reads her
    # own requests through the API, not the whole queue's metrics.
    server_token = hub.environ("alice")["JUPYTERHUB_API_TOKEN"]
    mine = requests.get(
        f"{hub.url}/services/gpuaas/api/requests",
        headers={"Authorization": f"token {server_token}"},
        timeout=10,
    )
    assert mine.status_code == 200, mine.text
    user = requests.get(url, headers={"Authorization": f"token {server_token}"}, timeout=10)
    assert user.status_code == 403, user.text
    assert "view scope" in user.json()["error"]

    scrape = requests.get(url, headers={"Authorization": f"token {hub.token}"}, timeout=10)
    assert scrape.status_code == 200, scrape.text
    held = []
    for family in text_string_to_metric_families(scrape.text):
        if family.name == "gpuaas_device_utilization_ratio":
            held += [s.labels for s in family.samples if s.labels["tenant"] == "vision"]
    assert held and {labels["user"] for labels in held} == {""}
    assert "alice" not in scrape.text
