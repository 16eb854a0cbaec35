"""PostgreSQL frozen under load (issue 40, item 2): the gateway does not freeze with it.

A real PostgreSQL server of the test's own is stopped with SIGSTOP (the postmaster and
every backend) while clients keep submitting through a real gateway process. While it is
frozen, `api/health` answers within a second and says the store is unresponsive, and
submissions are answered 503 with Retry-After within the store deadline; once it runs
again, every submission answered 201 is in the store and none answered 503 is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from faultutil import Freezer, postmaster_pid
from gwutil import GatewayProcess, call, store_rows
from helpers import wait_for

pytestmark = pytest.mark.slow  # a process frozen for seconds, on purpose

STORE_TIMEOUT = 2


def test_frozen_postgres_gets_fast_503s_and_loses_nothing(
    spawn: Callable[..., GatewayProcess], freezer: Freezer, own_postgres: Any
) -> None:
    db_url = own_postgres.url_
    gw = spawn(db_url, f"--GatewayApp.store_timeout={STORE_TIMEOUT}", "--lease-ttl=600")
    answers: list[tuple[str, int, Any, dict[str, str]]] = []
    lock = threading.Lock()
    stop = threading.Event()
    names = iter(range(1_000_000))

    def client() -> None:
        while not stop.is_set():
            with lock:
                name = f"load-{next(names)}"
            body = {"tenant": "vision", "kind": "job", "gpus": 1, "name": name}
            # Far longer than the store deadline: an answer that is late is seen as late.
            status, data, headers = call(gw.url, "POST", "api/requests", body, timeout=30)
            with lock:
                answers.append((name, status, data, headers))
            time.sleep(0.05)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(answers) >= 4, 20, "answers under load before the freeze")
    before = len(answers)

    freezer.stop(postmaster_pid(own_postgres))
    try:
        time.sleep(STORE_TIMEOUT + 1)  # frozen past the store deadline (a duration)
        healths = []
        for _ in range(3):
            # A one-second client timeout: no answer in a second is status 0.
            status, body, headers = call(gw.url, "GET", "api/health", who=None, timeout=1.0)
            healths.append((status, body))
            time.sleep(0.5)
        frozen_answers = list(answers[before:])
    finally:
        freezer.resume()

    for status, body in healths:
        assert status == 503 and body["store"] == "unresponsive", healths
    refused = [a for a in frozen_answers if a[1] == 503]
    assert refused, f"no submission was answered while the store was frozen: {frozen_answers}"
    for _, status, data, headers in frozen_answers:
        assert status in (201, 503), (status, data)
        if status == 503:
            assert int(headers["Retry-After"]) >= 1 and data["error"], data

    # The store runs again: submissions are accepted again.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            recent = [a[1] for a in answers[-4:]]
        if recent and all(s == 201 for s in recent):
            break
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(40)
    assert all(s == 201 for s in recent), answers[-8:]

    rows = store_rows(db_url)
    stored_names = {r.name for r in rows.values()}
    for name, status, data, _ in answers:
        assert status != 500, data
        if status == 201:
            assert data["id"] in rows, f"{name} was answered 201 and is not stored"
        elif status == 503 and "may or may not" not in data["error"]:
            assert name not in stored_names, f"{name} was answered 503 and is stored"
    status, health, _ = call(gw.url, "GET", "api/health", who=None)
    assert status == 200 and health["store"] == "ok", health
