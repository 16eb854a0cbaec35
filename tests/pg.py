"""A throwaway PostgreSQL server for the tests: initdb, pg_ctl start, and gone afterwards.

The store must work on PostgreSQL, not just SQLite, and a mock would not catch the
differences (locking, types, transactional DDL), so the tests start a real server. It
runs on a free loopback port with its socket in its own temp dir, fsync off, and is
stopped with `-m immediate` because its data is thrown away anyway.

initdb refuses to run as root, so when the tests run as root the server runs as the
`postgres` user (`runuser -u postgres --`); otherwise it runs as the current user.
Set GPUAAS_TEST_POSTGRES_URL to use an existing server instead.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from helpers import free_port

DATABASE = "gpuaas_test"


class PostgresUnavailable(RuntimeError):
    """The binaries or the user to run them as are missing: skip, don't fail."""


def find_bin_dir() -> Path:
    """The directory holding initdb and pg_ctl: PATH first, then Debian's layout."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
        reverse=True,
    )
    for cand in candidates:
        bin_dir = Path(cand).parent
        if (bin_dir / "pg_ctl").exists():
            return bin_dir
    raise PostgresUnavailable(
        "PostgreSQL binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin;"
        " run scripts/ensure-system-deps.sh as root or install postgresql"
    )


class PostgresServer:
    def __init__(self) -> None:
        self.bin_dir = find_bin_dir()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            try:
                self._pw = pwd.getpwnam("postgres")
            except KeyError as e:
                raise PostgresUnavailable("running as root but there is no `postgres` user") from e
        self.dir = Path(tempfile.mkdtemp(prefix="gpuaas-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = 0
        self.started = False

    def _cmd(self, *argv: str) -> list[str]:
        cmd = [str(self.bin_dir / argv[0]), *argv[1:]]
        return ["runuser", "-u", "postgres", "--", *cmd] if self.as_postgres else cmd

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        # runuser keeps the environment; a C locale avoids initdb failing on a LANG
        # whose locale is not generated in a slim image.
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        return subprocess.run(
            self._cmd(*argv), capture_output=True, text=True, env=env, cwd=self.dir, timeout=120
        )

    def start(self) -> str:
        if self.as_postgres:
            os.chown(self.dir, self._pw.pw_uid, self._pw.pw_gid)
        r = self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        last_error = ""
        for _ in range(3):  # the free port may be taken between probing and binding
            self.port = free_port()
            opts = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            r = self._run(
                "pg_ctl",
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "-o",
                opts,
                "start",
            )
            if r.returncode == 0:
                self.started = True
                break
            last_error = r.stderr.strip() + "\n" + self._log_tail()
        else:
            raise RuntimeError(f"pg_ctl start failed: {last_error}")
        self._create_database()
        return self.url

    def _log_tail(self) -> str:
        try:
            return self.log.read_text()[-2000:]
        except OSError:
            return ""

    def _create_database(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user="postgres",
                    dbname="postgres",
                    autocommit=True,
                ) as conn:
                    conn.execute(f'CREATE DATABASE "{DATABASE}"')
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def stop(self) -> None:
        if self.started:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)
