"""Worker identity and liveness: who holds a lease, and whether a local lease holder is dead.

A process that starts on a host recovers the runs of its dead predecessors there at once instead
of waiting out their leases. Liveness is judged by pid plus the process's start time, so a
recycled pid never passes for the dead worker. This module reads /proc; it writes nothing.
"""

from __future__ import annotations

import os
import secrets
import socket

from tether.store.base import WorkerInfo


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields after its last ')' are fixed.
    return text[text.rfind(")") + 2 :].split()


def pid_token(pid: int) -> str:
    """The process's start time in clock ticks since boot, or '' where /proc is missing."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else ""


def process_alive(pid: int, token: str) -> bool:
    """Whether the process that registered (pid, token) still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc: the pid exists, assume it is the same process
    if fields[0] in ("Z", "X"):  # a zombie has exited; only its parent has not reaped it
        return False
    return not token or fields[19] == token


def this_worker(now: float) -> WorkerInfo:
    host = socket.gethostname()
    pid = os.getpid()
    return WorkerInfo(
        id=f"{host}:{pid}:{secrets.token_hex(4)}",
        host=host,
        pid=pid,
        pid_token=pid_token(pid),
        started_at=now,
        heartbeat_at=now,
    )
