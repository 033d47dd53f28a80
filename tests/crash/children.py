"""The environment of the crash tests' child processes.

A child gets the test's environment without Tether's and the crash tests' own variables
($TETHER_*, $CRASH_*, $PYTHONPATH: a fault or a database meant for another process must not leak
in), plus what the test gives it. Its bytecode is cached in a folder of the temporary directory
($PYTHONPYCACHEPREFIX), also where $PYTHONDONTWRITEBYTECODE is set: the crash tests start some
300 processes, and compiling tether (and psycopg) again in each costs about 70 ms of the ~0.3 s a
process takes to start. The cache is outside the repository, so no __pycache__ appears there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYCACHE = Path(tempfile.gettempdir()) / f"tether-crash-pycache-{os.getuid()}"
# What the children import: compiled once, before the first test starts one. PostgreSQL's
# driver may be missing (the PostgreSQL tests then skip).
WARM = """
import tether, tether.store.sqlite, tests.crash.proc, tests.crash.wait_proc
import tests.crash.approval_flows, tests.crash.agent_flows
try:
    import tether.store.postgres
except ImportError:
    pass
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TETHER_", "CRASH_", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE"))
    }
    # The checkout's own source first: the children test this tree, whichever is installed.
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               PYTHONPYCACHEPREFIX=str(PYCACHE))  # fmt: skip
    env.update(extra)
    return env


def warm_bytecode_cache() -> None:
    """Compile what the children import into the cache (little to do when it is fresh), so
    that no child's start, timed by the tests, pays for it."""
    subprocess.run(
        [sys.executable, "-c", WARM],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
