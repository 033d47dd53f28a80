"""How bench/peers.py drives a peer script (the scripts beside this file import it; it imports no
tether). Prints figures only; asserts nothing about times.

A peer script opens its contender (database, schema, one warm-up run), then either
- once: `--runs N` runs, then one JSON line: contender, scenario, runs, steps, seconds, steps/s,
  settings, versions; or
- with --serve: one JSON line {"ready": true, "contender": ..., "settings": ..., "versions": ...},
  then for each line N read from stdin, N runs (one after another, or started together for the
  concurrent scenario) and one JSON line {"runs": N, "seconds": ...}; at the end of stdin it
  closes. This lets bench/peers.py give every contender its turn in rotation, so a disk whose
  speed drifts during the run slows them alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Contender:
    label: str
    steps_per_run: int
    run: Callable[[int], float]  # seconds for n runs of the scenario
    close: Callable[[], None]
    settings: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)  # of the packages measured


def add_arguments(parser: argparse.ArgumentParser, runs: int) -> None:
    parser.add_argument("--scenario", choices=("sequential", "concurrent"), required=True)
    parser.add_argument("--runs", type=int, default=runs, help="without --serve")
    parser.add_argument("--serve", action="store_true", help="take run counts from stdin")


def emit(figures: dict[str, Any]) -> None:
    print(json.dumps(figures), flush=True)


def serve(contender: Contender, args: argparse.Namespace) -> None:
    try:
        if not args.serve:
            seconds = contender.run(args.runs)
            steps = args.runs * contender.steps_per_run
            emit(
                {
                    "contender": contender.label,
                    "scenario": args.scenario,
                    "runs": args.runs,
                    "steps": steps,
                    "seconds": seconds,
                    "steps_per_s": steps / seconds,
                    "settings": contender.settings,
                    "versions": contender.versions,
                }
            )
            return
        emit(
            {
                "ready": True,
                "contender": contender.label,
                "settings": contender.settings,
                "versions": contender.versions,
            }
        )
        for line in sys.stdin:
            runs = int(line)
            emit({"runs": runs, "seconds": contender.run(runs)})
    finally:
        contender.close()
