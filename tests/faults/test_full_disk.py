"""SQLite on a tiny filesystem (issue 40, item 4): a full disk is a failing store, never an
ambiguous answer, and space freed is space the gateway uses again.

A real 2 MiB tmpfs (mounted by root; skipped, saying why, where mounting is refused),
nearly filled with a ballast file; a real gateway process submits with Idempotency-Keys
until the disk is full.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gwutil import GatewayProcess, call, store_rows
from helpers import fill, wait_for

UNKNOWN = "may or may not"


def ballast(where: Path, leave: int) -> Path:
    """A file taking all of `where`'s free space but `leave` bytes."""
    path = where / "ballast"
    st = os.statvfs(where)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with open(path, "wb") as f:
        f.write(b"\0" * size)
    return path


def submit(url: str, key: str) -> tuple[int, Any, dict[str, str]]:
    body = {"tenant": "vision", "kind": "job", "gpus": 1, "name": key[:12]}
    return call(url, "POST", "api/requests", body, headers={"Idempotency-Key": key})


def test_full_disk_is_failing_unambiguous_and_recovers(
    spawn: Callable[..., GatewayProcess], tiny_fs: Callable[[str], Path]
) -> None:
    disk = tiny_fs("2m")
    db_url = f"sqlite:///{disk / 'gpuaas.sqlite'}"
    gw = spawn(db_url, "--lease-ttl=600")
    assert submit(gw.url, uuid.uuid4().hex)[0] == 201
    weight = ballast(disk, 192 * 1024)

    answers: list[tuple[str, int, Any]] = []
    for _ in range(3000):
        key = uuid.uuid4().hex
        status, data, headers = submit(gw.url, key)
        answers.append((key, status, data))
        if status != 201:
            break
    key, status, data = answers[-1]
    assert status == 503, answers[-1]
    assert UNKNOWN not in data["error"], data  # SQLite's failed COMMIT committed nothing
    assert int(headers["Retry-After"]) >= 1
    rest = fill(disk, "rest")  # what the failed write's checkpoint gave back, taken too

    status, body, _ = call(gw.url, "GET", "api/health", who=None, timeout=1.0)
    assert status == 503 and body["store"] == "failing", (status, body)
    for _ in range(5):  # still full: every answer a plain 503, never "may or may not"
        k = uuid.uuid4().hex
        s, d, _ = submit(gw.url, k)
        answers.append((k, s, d))
        assert s == 503 and UNKNOWN not in d["error"], d

    weight.unlink()
    rest.unlink()
    wait_for(
        lambda: call(gw.url, "GET", "api/health", who=None, timeout=1.0)[1]["store"] == "ok",
        20, "the store to work again with space again", interval=0.2,
    )  # fmt: skip
    # The refused ones, retried with their keys, are created now, each once.
    refused = [(k, s) for k, s, _ in answers if s == 503]
    for k, _ in refused:
        s, d, _ = submit(gw.url, k)
        assert s == 201, d
        assert submit(gw.url, k)[0] == 200  # the same key again: the same request
    rows = store_rows(db_url)
    keys = [r.idempotency_key for r in rows.values()]
    assert len(keys) == len(set(keys))
    for k, s, _ in answers:
        assert k in keys, f"{k} was answered {s} and is not stored after its retry"
