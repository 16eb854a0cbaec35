"""Schemathesis over the OpenAPI document, against a live gateway subprocess.

The CLI of schemathesis (the test extra) reads `api/openapi.json` from a real gateway and
runs its examples, coverage, fuzzing and stateful phases (following the document's links
from POST api/requests to the new request) with an admin token, so every handler is
reached, and with a plain user's. Every check is on: no 5xx, status codes and headers
the document lists, responses that match its schemas, input the document allows is
accepted and input it refuses is refused (`positive_data_acceptance`,
`negative_data_rejection`: the code and the document hold the same rules). The
exceptions, each with its reason, are in schemathesis.toml next to this file.

Bounded: a fixed number of examples per operation (GPUAAS_FUZZ_EXAMPLES; 40 as admin, 15
as a user), one worker, a fixed seed (GPUAAS_FUZZ_SEED) so a failure replays; about a
minute and a half on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from gwutil import TOKENS, GatewayProcess

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


# An admin reaches every handler; a plain member of one tenant meets the 403s and the
# per-user views (fewer examples: the same document, other answers).
WHO = [("root", "40"), ("alice", "15")]


@pytest.mark.parametrize(("who", "examples"), WHO, ids=[w for w, _ in WHO])
def test_schemathesis_finds_nothing(
    spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path, who: str, examples: str
) -> None:
    cli = Path(sys.executable).with_name("schemathesis")
    if not cli.exists():
        pytest.fail("schemathesis is missing: `pip install -e .[test]` (make setup)")
    gw = spawn_gateway(f"sqlite:///{tmp_path / 'fuzz.sqlite'}", "--lease-ttl=600")
    argv = [
        str(cli),
        "--no-color",
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "run",
        gw.url + "api/openapi.json",
        "--header",
        f"Authorization: token {TOKENS[who]}",
        "--checks",
        "all",
        # DELETE cancels or releases; the request stays in the history (schemathesis.toml).
        "--exclude-checks",
        "use_after_free",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        os.environ.get("GPUAAS_FUZZ_EXAMPLES", examples),
        "--seed",
        os.environ.get("GPUAAS_FUZZ_SEED", "1"),
        "--workers",
        "1",
        "--request-timeout",
        "10",
        # The event stream never ends and its keep-alives beat any read timeout: a
        # request/response fuzzer would wait on it forever. SSE has its own tests
        # (test_sse.py, test_sse_replay.py).
        "--exclude-path",
        "/api/events",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = r.stdout + r.stderr
    print(out[-3000:])
    assert r.returncode == 0, out[-12000:]
    assert " passed" in out and "failures" not in out.split("SUMMARY")[-1].lower(), out[-6000:]
    # The gateway itself lived through it (no crash, no traceback in its log).
    assert gw.proc.poll() is None
    log = gw.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]
