"""The demos run as a user runs them: real worker processes, a real SIGKILL, and the demo's own
checks of its evidence (it exits non-zero when a tool ran twice or the run did not succeed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_demo(name: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TETHER_DATABASE_URL")}  # fmt: skip
    env["COLUMNS"] = "160"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.timeout(180)
def test_the_agent_demo_deploys_once_after_an_approval_made_while_no_worker_ran() -> None:
    out = run_demo("agent_demo.py")
    assert "killed with SIGKILL" in out
    assert "approved by alice" in out
    assert "every tool ran exactly once; the deploy ran once, after approval" in out
    assert "hash chain intact" in out
    assert out.count("deploy starts") == 1


@pytest.mark.timeout(180)
def test_the_crash_demo_finishes_the_run_with_every_completed_step_run_once() -> None:
    out = run_demo("crash_demo.py")
    assert "every completed step ran exactly once; the interrupted one ran again" in out
