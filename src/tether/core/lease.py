"""Worker identity and liveness: who holds a lease, and whether a lease holder is known dead.

A process that starts on a machine recovers the runs of its dead predecessors there at once
instead of waiting out their leases. A pid means something only inside one boot of one kernel
and one PID namespace (containers share host names, and each counts its own pids), so a
worker is judged by its pid only where its boot id and PID namespace are this process's own;
its pid's start time then tells a recycled pid from the worker. This module reads /proc; it
writes nothing.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from functools import cache

from tether.store.port import WorkerInfo


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


@cache
def boot_id() -> str:
    """This kernel boot's id, or '' where the system does not tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@cache
def pid_namespace() -> str:
    """This process's PID namespace (e.g. 'pid:[4026531836]'), or '' where unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def same_machine(worker: WorkerInfo) -> bool:
    """Whether `worker`'s pid names a process this process can look at: the same boot of the
    same kernel, in the same PID namespace (both known)."""
    return bool(worker.boot_id and worker.pid_ns) and (worker.boot_id, worker.pid_ns) == (
        boot_id(),
        pid_namespace(),
    )


def process_alive(pid: int, token: str) -> bool:
    """Whether the process that registered (pid, token) still runs here (see same_machine)."""
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


def dead_here(worker: WorkerInfo) -> bool:
    """Whether `worker` is known dead: its process was on this machine and is gone."""
    return same_machine(worker) and not process_alive(worker.pid, worker.pid_token)


def gone(worker_id: str, workers: Sequence[WorkerInfo]) -> bool:
    """Whether worker `worker_id` is over for certain: its row is gone (it released its runs
    on a graceful stop, or was recovered as dead) or its process died on this machine."""
    found = [w for w in workers if w.id == worker_id]
    return not found or dead_here(found[0])


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
        boot_id=boot_id(),
        pid_ns=pid_namespace(),
    )
