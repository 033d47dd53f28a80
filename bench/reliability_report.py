"""Regenerate the fault-suite figures of docs/reliability.md (`make reliability-report`).

Runs `pytest tests/faults tests/crash -q`, takes the figures it prints at the end of the session
(the "fault suite figures" section of tests/faults/conftest.py and the crash tally of
tests/crash/conftest.py), and rewrites the part of the doc between the markers
`<!-- fault-suite figures: begin -->` and `<!-- end -->` with them and today's date. The doc is
left alone when the suite fails. `--output FILE` reads a saved pytest output instead of running.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- fault-suite figures: begin -->", "<!-- end -->"
COMMAND = ["-m", "pytest", "tests/faults", "tests/crash", "-q"]
FIGURE = re.compile(r"^(?P<name>.+): (?P<value>-?[\d.]+) \(over (?P<n>\d+) measurements?\)$")
OUTCOME = re.compile(r"^\d+ (passed|failed|error).* in [\d.]+s")
CRASH = ("crash points tried:", "slowest recovery")


def run_suite() -> tuple[int, list[str]]:
    """Run the suites, echoing their output; (exit code, output lines)."""
    proc = subprocess.Popen([sys.executable, *COMMAND], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    return proc.wait(), lines


def section(lines: list[str], today: str) -> str:
    """The doc's figures section, from pytest's output."""
    figures, crash, outcome = [], [], ""
    in_figures = False
    for line in lines:
        if OUTCOME.match(line.strip("= ")):
            outcome = line.strip("= ")
        elif line.startswith("="):
            in_figures = "fault suite figures" in line
        elif in_figures and (m := FIGURE.match(line)):
            figures.append(f"| {m['name']} | {m['value']} |")
        elif line.startswith(CRASH):
            crash.append(f"- {line}")
    if not figures:
        raise SystemExit("no fault suite figures in the output: nothing to write")
    return "\n".join([
        BEGIN,
        f"Measured {today} by `make reliability-report` (`pytest {' '.join(COMMAND[2:])}`: "
        f"{outcome or 'outcome not shown'}). Counts are summed over the tests that record them.",
        "", "| figure | value |", "|---|---|", *figures, "", *crash, END,
    ])  # fmt: skip


def rewrite(doc: str, new: str) -> str:
    start = doc.find(BEGIN)
    end = doc.find(END, start)
    if start < 0 or end < 0:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} markers")
    return doc[:start] + new + doc[end + len(END) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="a saved pytest output to read instead")
    args = parser.parse_args()
    if args.output is not None:
        lines = args.output.read_text(encoding="utf-8").splitlines()
    else:
        code, lines = run_suite()
        if code != 0:
            raise SystemExit(f"the suites failed (exit {code}); {DOC.name} left as it was")
    DOC.write_text(rewrite(DOC.read_text(encoding="utf-8"), section(lines, str(date.today()))),
                   encoding="utf-8")  # fmt: skip
    print(f"rewrote the fault-suite figures of {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
