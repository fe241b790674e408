"""A throwaway PostgreSQL server for the tests: no server needs to be running beforehand.

The session-scoped fixture `postgres` runs ``initdb`` into a temporary directory (as the
``postgres`` system user when the tests run as root: neither initdb nor the server runs as
root), starts the server with ``pg_ctl`` listening on a unix socket in that directory only
(no TCP port, so parallel runs on one machine never collide), and stops it and removes the
directory at the end of the session, even when tests fail. ``fsync`` is off: the tests
kill clients, never the server, and an fsync per commit would only slow them down.

`postgres_url` (per test) is the URL of a fresh, empty database, so tests never see each
other's rows. The binaries come from Debian's ``postgresql`` package
(``/usr/lib/postgresql/<version>/bin``) or from PATH; when they are missing the fixture
fails with a message naming the package (``.ci/run`` installs it), never skips.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

__all__ = [
    "PostgresServer",
    "find_binaries",
    "postgres",
    "postgres_url",
    "running_server",
    "without_the_extra",
]

_START_TIMEOUT_S = 60
_MISSING = (
    "PostgreSQL's initdb and pg_ctl were not found (looked in /usr/lib/postgresql/*/bin and "
    "on PATH). The PostgreSQL tests start a throwaway server of their own: install the "
    "server binaries, on Debian/Ubuntu `apt-get install postgresql` (.ci/run does it), or "
    "put initdb and pg_ctl on PATH."
)


def find_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: Debian's newest version first,
    then PATH; None if neither has them."""

    def version(path: str) -> int:
        name = Path(path).parent.parent.name
        return int(name) if name.isdigit() else 0

    for initdb in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True):
        directory = Path(initdb).parent
        if (directory / "pg_ctl").exists():
            return directory
    initdb_on_path = shutil.which("initdb")
    if initdb_on_path and shutil.which("pg_ctl"):
        return Path(initdb_on_path).parent
    return None


class PostgresServer:
    """A private PostgreSQL server in ``directory`` (data in ``directory/data``, socket in
    ``directory``), superuser ``postgres``, trust authentication."""

    def __init__(self, directory: Path, binaries: Path) -> None:
        self.directory = directory
        self.binaries = binaries
        self._as_postgres = os.geteuid() == 0
        self._numbers = itertools.count(1)
        self.dsn = f"host={directory} user=postgres dbname=postgres"
        self.url = self.url_of("postgres")

    def url_of(self, database: str) -> str:
        """The ``postgresql://`` URL of ``database`` on this server (socket directory in
        the ``host`` parameter)."""
        return f"postgresql://postgres@/{database}?host={quote(str(self.directory), safe='')}"

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_postgres else []
        result = subprocess.run(
            [*prefix, *command],
            capture_output=True,
            text=True,
            timeout=_START_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            msg = (
                f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )
            raise RuntimeError(msg)

    def start(self) -> None:
        if self._as_postgres:
            shutil.chown(self.directory, user="postgres")
        data = str(self.directory / "data")
        self._run(
            str(self.binaries / "initdb"),
            "-D",
            data,
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "--encoding=UTF8",
            "--no-instructions",
        )
        options = (
            f"-k {self.directory} -c listen_addresses='' -c fsync=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.binaries / "pg_ctl"),
            "-D",
            data,
            "-o",
            options,
            "-l",
            str(self.directory / "server.log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        data = self.directory / "data"
        if (data / "postmaster.pid").exists():
            self._run(
                str(self.binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"
            )

    def create_database(self) -> str:
        """A new empty database ``t_<n>``; returns its URL."""
        name = f"t_{next(self._numbers)}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url_of(name)


@contextlib.contextmanager
def running_server(binaries: Path | None = None) -> Iterator[PostgresServer]:
    """A started throwaway server (see the module docstring), stopped and removed on exit
    even on error: the fixture's, and the benchmarks'.

    Raises:
        RuntimeError: ``binaries`` is None and `find_binaries` finds none (the message
            names the package), or the server would not start.
    """
    if binaries is None:
        binaries = find_binaries()
        if binaries is None:
            raise RuntimeError(_MISSING)
    # Short path: a unix socket's path is limited to about 100 bytes.
    directory = Path(tempfile.mkdtemp(prefix="pgtest-", dir="/tmp"))
    server = PostgresServer(directory, binaries)
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for this test session (see the module docstring)."""
    binaries = find_binaries()
    if binaries is None:
        pytest.fail(_MISSING, pytrace=False)
    with running_server(binaries) as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """The URL of a fresh, empty database of its own for this test."""
    return postgres.create_database()


def without_the_extra(code: str) -> str:
    """The output of ``code`` run by a new interpreter (in the repository) in which psycopg
    and psycopg_pool cannot be imported, as without the ``[postgres]`` extra; the test
    fails if it exits with an error."""
    script = (
        f"import sys\nsys.modules['psycopg'] = None\nsys.modules['psycopg_pool'] = None\n{code}"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
