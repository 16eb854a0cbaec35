"""Fixtures of the batch job tests (helpers and the set-up in jobutil.py): a gateway and a
Jupyter server per module, and an IPython shell with the magics pointed at that server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from jobutil import Gateway, Server, start_gateway, start_server


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(tmp_path_factory.mktemp("gateway"))
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def server(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(gateway, tmp_path_factory.mktemp("home"))
    yield s
    s.stop()


@pytest.fixture
def shell(server: Server, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An IPython shell with the magics, as in a kernel of `server`, in its root dir."""
    from IPython.core.interactiveshell import InteractiveShell

    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(server.root)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpuaas")
    return ip
