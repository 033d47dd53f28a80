"""The `tether` command line: inspect and cancel runs, send events, decide approvals (as the user
of a token: `tether login`), check that stored histories still replay, and run a worker.

A thin shell over the library: this module assembles the root group from one module per
concept (runs, events, approvals, credentials, replay, worker; shared helpers in common). None
of them may hold engine logic, talk SQL or import a backend: what they need beyond parsing and
printing belongs in the library.
"""

from __future__ import annotations

import click

from tether.cli.approvals import approvals
from tether.cli.common import TetherGroup
from tether.cli.credentials import login, logout
from tether.cli.events import events
from tether.cli.maintenance import gc, status
from tether.cli.migrate import migrate
from tether.cli.replay import replay_check
from tether.cli.runs import runs
from tether.cli.schedules import schedules
from tether.cli.serve import serve
from tether.cli.users import users
from tether.cli.versions import runs_move_version  # noqa: F401  (adds runs move-version)
from tether.cli.worker import worker


@click.group(cls=TetherGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tether", message="tether %(version)s")
def cli() -> None:
    """Tether: durable execution of workflows. Inspect, cancel and signal runs, decide
    approvals as the user of a token (`tether login`), check that stored histories replay
    under the current code, and run workers."""


for command in (runs, events, approvals, users, login, logout, replay_check, serve, worker,
                schedules, gc, status):  # fmt: skip
    cli.add_command(command)
cli.add_command(migrate)


def main() -> None:
    """The console script `tether`."""
    cli(prog_name="tether")


__all__ = ["cli", "main"]
