"""Jobs stay inside the server's root, and the sidebar's proxy inside its allow-list
(issue 40, item 7): a real Jupyter server with the extension and a real gateway, both
subprocesses (tests/jobs/conftest.py), over real HTTP.

- a job's notebook, script or working directory that resolves outside `root_dir` (`..`,
  an absolute path, a symlink) is a 403 naming the path, with nothing of the file;
- a cell or script job's interpreter is this server's, a kernelspec's or one of
  `JobManager.interpreters`: anything else is a 403;
- a log offset that is not a byte count is a 400;
- `/gpuaas/api/requests/x%2F..%2F..%2Fmetrics` never reaches the gateway's `metrics`.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

from helpers import wait_for
from jobutil import SERVER_TOKEN, Gateway, Server

SECRET = "TOPSECRET-first-line-of-a-file-outside-the-root"


def raw(server: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, JSON or text) of one call to the server, never raising for a status."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url + path, data=data, method=method,
        headers={"Authorization": f"token {SERVER_TOKEN}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text.decode(errors="replace")


def test_job_paths_outside_the_root_are_403_and_echo_nothing(server: Server) -> None:
    outside = server.root.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.py").write_text(f"{SECRET}\nprint(1)\n")
    (outside / "secret.ipynb").write_text(f"{SECRET}\nnot a notebook\n")
    (server.root / "escape.py").unlink(missing_ok=True)
    (server.root / "escape.py").symlink_to(outside / "secret.py")
    (server.root / "escape.ipynb").unlink(missing_ok=True)
    (server.root / "escape.ipynb").symlink_to(outside / "secret.ipynb")
    (server.root / "escape-dir").unlink(missing_ok=True)
    (server.root / "escape-dir").symlink_to(outside)
    python = sys.executable
    cases = [
        ({"kind": "script", "path": "../outside/secret.py", "python": python}, "path"),
        ({"kind": "script", "path": str(outside / "secret.py"), "python": python}, "path"),
        ({"kind": "script", "path": "escape.py", "python": python}, "path"),
        ({"kind": "script", "path": "escape-dir/secret.py", "python": python}, "path"),
        ({"kind": "notebook", "path": "../outside/secret.ipynb"}, "path"),
        ({"kind": "notebook", "path": "escape.ipynb"}, "path"),
        ({"kind": "notebook", "path": "sub/../../outside/secret.ipynb"}, "path"),
        ({"kind": "cell", "code": "print(1)", "cwd": "..", "python": python}, "cwd"),
        ({"kind": "cell", "code": "print(1)", "cwd": "/", "python": python}, "cwd"),
        ({"kind": "cell", "code": "print(1)", "cwd": "escape-dir", "python": python}, "cwd"),
    ]
    for spec, field in cases:
        status, body = raw(server, "POST", "gpuaas/jobs", {**spec, "gpus": 1})
        assert status == 403, (spec, body)
        given = spec.get("path", spec.get("cwd"))
        assert body["field"] == field and repr(given) in body["error"], (spec, body)
        assert "outside the server's root" in body["error"], body
        assert SECRET not in json.dumps(body), body
    # Nothing was asked of the gateway, nothing recorded.
    assert not [j for j in server.call("GET", "gpuaas/jobs") if "secret" in j["name"]]


def test_a_notebook_that_does_not_parse_is_not_echoed(server: Server) -> None:
    (server.root / "broken.ipynb").write_text(f"{SECRET}\n")
    status, body = raw(
        server, "POST", "gpuaas/jobs", {"kind": "notebook", "path": "broken.ipynb", "gpus": 1}
    )
    assert status == 400 and body["field"] == "path", body
    assert SECRET not in json.dumps(body) and "TOPSECRET" not in json.dumps(body), body


def test_the_interpreter_must_be_a_known_one(server: Server, gateway: Gateway) -> None:
    (server.root / "hello.py").write_text("print('hello from a job')\n")
    for python in ("/bin/sh", "/usr/bin/env", str(server.root / "hello.py"), "python", "../x"):
        spec = {"kind": "script", "path": "hello.py", "gpus": 1, "python": python}
        status, body = raw(server, "POST", "gpuaas/jobs", spec)
        assert status == 403 and body["field"] == "python", (python, body)
        assert "not an interpreter of this server" in body["error"], body
    cell = {"kind": "cell", "code": "print(1)", "gpus": 1, "python": "/bin/sh"}
    status, body = raw(server, "POST", "gpuaas/jobs", cell)
    assert status == 403 and body["field"] == "python", body
    # The kernel's own interpreter (what %%gpu_job and `jupyter-gpuaas submit` send) runs.
    spec = {"kind": "script", "path": "hello.py", "gpus": 1, "python": sys.executable}
    status, job = raw(server, "POST", "gpuaas/jobs", spec)
    assert status == 201, job
    url = f"gpuaas/jobs/{job['id']}"
    job = wait_for(
        lambda: (j := server.call("GET", url))["state"] in ("succeeded", "failed") and j,
        60,
        "the job to end",
        interval=0.2,
    )
    assert job["state"] == "succeeded", job
    logs = f"gpuaas/jobs/{job['id']}/logs"
    status, text = raw(server, "GET", logs + "?offset=5")
    assert status == 200 and text == " from a job\n", text
    # A log offset that is not a byte count: 400 with the field, never a 500.
    for query in ("offset=1e23", "offset=-1", "offset=1.5", "offset=%C2%B2", "offset=" + "9" * 30,
                  "tail=" + "9" * 30, "tail=%D9%A1", "offset="):  # fmt: skip
        status, body = raw(server, "GET", f"{logs}?{query}")
        assert status == 400, (query, body)
        assert body["field"] == query.split("=")[0] and "whole number" in body["error"], body
    assert gateway.free_gpus() == 1


def test_the_proxy_checks_the_decoded_path(server: Server, gateway: Gateway) -> None:
    for path in (
        "requests/x%2F..%2F..%2Fmetrics",
        "requests/x%2F..%2F..%2Fopenapi.json",
        "me/x%2F..%2F..%2Fmetrics",
        "requests/%2E%2E%2F%2E%2E%2Fmetrics",
        "tenants/..%2Fevents",
        "requests/.%2Fx",
    ):
        status, body = raw(server, "GET", f"gpuaas/api/{path}")
        assert status == 404, (path, body)
        assert isinstance(body, dict) and "not a gateway route" in body["error"], (path, body)
        assert "gpuaas_" not in json.dumps(body)
    # None of them left the server: the gateway's access log has no dot segment. (A read
    # that went well is logged at debug; the gateway's 404 for an unknown request is
    # logged, so it shows that what the proxy forwards does reach that log.)
    raw(server, "GET", "gpuaas/api/requests/r-00000000000000ff")

    def logged() -> str | None:
        text = gateway.log.read_text(errors="replace")
        return text if "GET /api/requests/r-00000000000000ff" in text else None

    log = wait_for(logged, 10, "the gateway to log the request", detail=gateway.tail)
    assert "/.." not in log and "/./" not in log, log[-2000:]
    # What the sidebar asks for still reaches the gateway, encoded the same way.
    status, body = raw(server, "GET", "gpuaas/api/me")
    assert status == 200 and body["name"] == "alice", body
    status, body = raw(server, "GET", "gpuaas/api/requests/r-0123456789abcdef")
    assert status == 404 and "no request" in body["error"], body
    # The sidebar's advice (api/advice): the user's own, through the server's token.
    status, body = raw(server, "GET", "gpuaas/api/advice?since=7d")
    assert status == 200 and isinstance(body, dict), (status, body)
    assert body["advice"] == [] and body["stale"] is False, body
    status, body = raw(server, "GET", "gpuaas/api/advice/x")  # no such route: not forwarded
    assert status == 404 and "api/advice/x" not in gateway.log.read_text(errors="replace")
