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


@contextlib.contextmanager
def postgres_server() -> Iterator[str | None]:
    """The URL of a PostgreSQL database for tests, or None when none can be had here."""
    configured = os.environ.get("TETHER_TEST_POSTGRES_URL")
    if configured:
        yield configured
        return
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="tether-pg-"))
    data, log = folder / "data", folder / "server.log"
    drop, uid, gid = _as_user()
    if uid is not None and gid is not None:
        os.chown(folder, uid, gid)
        folder.chmod(0o700)
    port = _free_port()
    env = dict(os.environ, LC_ALL="C")
    try:
        subprocess.run(
            [initdb, "-D", str(data), "-U", "tether", "--auth=trust", "-E", "UTF8", "--no-sync"],
            preexec_fn=drop, env=env, cwd=folder, capture_output=True, text=True, check=True,
        )  # fmt: skip
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={folder} "
            "-c fsync=off -c max_connections=200 -c shared_buffers=32MB"
        )
        subprocess.run(
            [pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"],
            preexec_fn=drop, env=env, cwd=folder, capture_output=True, text=True, check=True,
        )  # fmt: skip
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"could not start a test PostgreSQL: {exc} {detail}") from exc
    try:
        yield f"postgresql://tether@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
            preexec_fn=drop, env=env, cwd=folder, capture_output=True, check=False,
        )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"
