"""A throwaway PostgreSQL server for the test suite.

$TETHER_TEST_POSTGRES_URL wins when set. Otherwise a cluster is made with the server binaries
on this machine (initdb, pg_ctl) in a temporary folder, listening on 127.0.0.1 only, as an
unprivileged user when the tests run as root, and removed afterwards. Tests get one schema
each (`?schema=` in the URL), so they never see each other's rows.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> tuple[Callable[[], None] | None, int | None, int | None]:
    """PostgreSQL refuses to run as root: drop to `nobody` for its processes."""
    if os.geteuid() != 0:
        return None, None, None
    user = pwd.getpwnam("nobody")

    def drop() -> None:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return drop, user.pw_uid, user.pw_gid


class LocalPostgres:
    """A cluster in a temporary folder, run as an unprivileged user when we are root."""

    def __init__(self, *, durable: bool = False) -> None:
        # Tests run without fsync (their crashes are of processes, not of the machine);
        # benchmarks run durable, as a deployment would (fsync, synchronous_commit=on).
        self.durable = durable
        initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise FileNotFoundError("no initdb/pg_ctl on this machine")
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.folder = Path(tempfile.mkdtemp(prefix="tether-pg-"))
        self.data = self.folder / "data"
        self.drop, uid, gid = _as_user()
        if uid is not None and gid is not None:
            os.chown(self.folder, uid, gid)
            self.folder.chmod(0o700)
        self.port = _free_port()

    @property
    def url(self) -> str:
        return f"postgresql://tether@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> None:
        try:
            subprocess.run(
                list(args), preexec_fn=self.drop, env=dict(os.environ, LC_ALL="C"),
                cwd=self.folder, capture_output=True, text=True, check=check,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"{args[0]} failed: {exc.stderr}") from exc

    def start(self) -> None:
        """Start the server (again, after stop(): on the same port). Another process may take
        the port between _free_port() and the server's bind (make test runs the suite on two
        processes, each with a server of its own): a first start then takes another port."""
        first = not self.data.exists()
        if first:
            self._run(self.initdb, "-D", str(self.data), "-U", "tether", "--auth=trust",
                      "-E", "UTF8", "--no-sync")  # fmt: skip
        log = self.folder / "server.log"
        for attempt in range(1, 4):
            logged = log.stat().st_size if log.exists() else 0
            options = (
                f"-p {self.port} -c listen_addresses=127.0.0.1 "
                f"-c unix_socket_directories={self.folder} "
                f"-c fsync={'on' if self.durable else 'off'} "
                "-c max_connections=200 "
                "-c shared_buffers=32MB"
            )
            try:
                self._run(self.pg_ctl, "-D", str(self.data), "-l", str(log),
                          "-o", options, "-w", "-t", "60", "start")  # fmt: skip
                return
            except RuntimeError:
                with open(log, "rb") as f:
                    f.seek(logged)
                    taken = b"already in use" in f.read()
                if not (first and taken) or attempt == 3:
                    raise
                self.port = _free_port()

    def stop(self, mode: str = "fast") -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[str | None]:
    """The URL of a PostgreSQL database for tests, or None when none can be had here."""
    configured = os.environ.get("TETHER_TEST_POSTGRES_URL")
    if configured:
        yield configured
        return
    try:
        server = LocalPostgres()
    except FileNotFoundError:
        yield None
        return
    try:
        server.start()
        yield server.url
    finally:
        server.remove()


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def execute_in(url: str, *statements: str) -> None:
    """Run SQL statements (a test's triggers, say) in the schema of a Tether URL, committed."""
    import psycopg

    from tether.store.postgres import parse_postgres_url

    conninfo, schema = parse_postgres_url(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if schema is not None:
            conn.execute(f'SET search_path TO "{schema}"')
        for statement in statements:
            conn.execute(statement.encode())


async def connect_in(url: str) -> psycopg.AsyncConnection[Any]:
    """A connection of a test's own in the schema of a Tether URL, not in autocommit (a
    transaction of its own that holds locks, say)."""
    import psycopg

    from tether.store.postgres import parse_postgres_url

    conninfo, schema = parse_postgres_url(url)
    conn = await psycopg.AsyncConnection.connect(conninfo)
    if schema is not None:
        await conn.execute(f'SET search_path TO "{schema}"')
    return conn
