"""The README's examples run as written: documentation kept true to the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_example_runs_and_prints_its_receipt(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README has no python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    env = dict(os.environ, TETHER_DATABASE_URL=f"sqlite:///{tmp_path}/readme.db")
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "published with tether-" in out.stdout


def test_the_readme_example_of_transactions_outbox_values_and_forks_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "outbox" in b]
    script = tmp_path / "example.py"
    script.write_text(block)
    env = dict(os.environ, TETHER_DATABASE_URL=f"sqlite:///{tmp_path}/readme.db")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "receipt for o-1: 42 recorded" in lines
    assert any(line.startswith("fork ") and line.endswith("receipt for o-1: 42") for line in lines)
    billed = [line for line in lines if line.startswith("billing")]
    assert len(billed) == 1  # the fork replayed the transaction: no second message
