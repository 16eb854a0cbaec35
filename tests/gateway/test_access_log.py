"""The gateway's access log keeps routine reads quiet (issue 45, item 7): the Hub's service
check, health probes and pollers GET every few seconds, and at info level they buried the
lines an admin looks for. A real gateway process at its default log level: a read that went
well is not logged, a change is, and so is every refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
from gwutil import call, launch_gateway


@pytest.mark.slow
def test_routine_reads_are_quiet_and_changes_and_refusals_are_logged(tmp_path: Path) -> None:
    gw = launch_gateway(tmp_path, f"sqlite:///{tmp_path / 'gpuaas.sqlite'}")
    try:
        for _ in range(3):
            assert call(gw.url, "GET", "api/health")[0] == 200
        assert call(gw.url, "GET", "api/requests", who="alice")[0] == 200
        body = {"tenant": "vision", "kind": "job", "gpus": 1}
        assert call(gw.url, "POST", "api/requests", body, who="alice")[0] == 201
        assert call(gw.url, "GET", "api/requests/r-nosuch", who="alice")[0] == 404
    finally:
        gw.stop()
    lines = gw.log.read_text().splitlines()
    access = [line for line in lines if " /api/" in line and "ms" in line]
    assert not [line for line in access if "GET /api/health" in line], access
    assert not [line for line in access if "200 GET /api/requests" in line], access
    assert [line for line in access if "201 POST /api/requests" in line], lines[-20:]
    assert [line for line in access if "404 GET /api/requests/r-nosuch" in line], lines[-20:]
