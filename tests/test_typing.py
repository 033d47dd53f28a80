"""Tether's types reach its users: the package ships py.typed, and the project's mypy --strict
accepts a user's file of typed steps and workflows (tests/typing/user_ok.py) and refuses, line
by line, the wrong calls of another (tests/typing/user_bad.py, each marked `# E: what`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tether

FILES = Path(__file__).parent / "typing"
EXPECTED = {  # what mypy must say of each marked line of user_bad.py
    "wrong-type": "[call-overload]",
    "wrong-keyword-type": 'Argument "depth" to "start" of "App" has incompatible type "str"',
    "missing": "[call-overload]",
    "unknown-keyword": 'Unexpected keyword argument "colour"',
    "result-type": 'expression has type "int", variable has type "str"',
    "step-argument": 'Argument 1 to "__call__" of "Step" has incompatible type "int"',
}


def test_the_package_ships_its_py_typed_marker() -> None:
    assert (Path(tether.__file__).parent / "py.typed").is_file()


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Outside the repository, with a config of its own: a user's setup, not the project's.
    folder = tmp_path_factory.mktemp("typing")
    for name in ("user_ok.py", "user_bad.py"):
        shutil.copy(FILES / name, folder / name)
    (folder / "mypy.ini").write_text("[mypy]\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini",
         "--cache-dir", str(folder / ".cache"), "--hide-error-context", "--no-pretty",
         "user_ok.py", "user_bad.py"],
        cwd=folder, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done.stdout + done.stderr


def test_mypy_strict_accepts_a_users_typed_steps_and_workflows(mypy_output: str) -> None:
    assert "user_ok.py" not in mypy_output, mypy_output


def test_mypy_strict_refuses_wrong_arguments_and_result_types_line_by_line(
    mypy_output: str,
) -> None:
    marked = {
        number: match.group(1)
        for number, line in enumerate((FILES / "user_bad.py").read_text().splitlines(), 1)
        if (match := re.search(r"# E: (\S+)", line))
    }
    assert sorted(marked.values()) == sorted(EXPECTED)
    errors: dict[int, str] = {}
    for line in mypy_output.splitlines():
        if (found := re.match(r"user_bad\.py:(\d+): error: (.*)", line)) is not None:
            errors[int(found.group(1))] = found.group(2)
    assert sorted(errors) == sorted(marked), mypy_output
    for number, what in marked.items():
        assert EXPECTED[what] in errors[number], (what, errors[number])
