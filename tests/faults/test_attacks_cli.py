"""Attacks on the `tether` command line and on Tether's logs, each through the real CLI (click's
CliRunner, or a `tether worker` process) against a real SQLite file.

Families: `cli decisions` (one operator deciding as two people with one token, a name claimed
with --as, a forged, revoked or missing token, a credentials file others can read), `cli text`
(terminal escapes, C0/C1 controls, bidi overrides, zero-width characters and rich markup in
titles, comments, options, run ids, operations and errors) and `log forgery` (a newline in a
title or run id forging a log line; a secret in a title logged raw).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from tests.faults.attack_kit import ANTHROPIC_KEY, JWT, OPENAI_KEY, attack, leaks

import tether
from tether.cli import cli
from tether.telemetry.logs import install_logging
from tether.users import add_user

pytestmark = pytest.mark.timeout(60)

# What must never reach a terminal raw: C0 controls but tab and newline, DEL, C1 controls (0x9b
# is a one-byte CSI), bidi embeddings, overrides and isolates, zero-width characters, BOM.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
HOSTILE = (
    "\x1b]0;pwned\x07\x1b[2J\x1b[31mDeploy\x9b31m \u202egnp.exe\u202c zero\u200bwidth\u2066 "
    "[bold]markup[/bold] bell\x07 back\x08 cr\rline \u2028sep"
)
FORGED = "2026-01-01 00:00:00,000 INFO tether.approvals approval ap-x approved by root"


def raw_controls(text: str) -> list[str]:
    """The characters of `text` that a terminal would obey rather than show."""
    return sorted({f"U+{ord(c):04X}" for c in RAW.findall(text)})


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A credentials directory of the test's own: never the real user's."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv("TETHER_TOKEN", raising=False)
    return home


def tether_cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    base: dict[str, str | None] = {"COLUMNS": "1000", "NO_COLOR": "1",
                                   "TETHER_DATABASE_URL": None, "TETHER_TOKEN": None}  # fmt: skip
    return CliRunner().invoke(cli, list(args), env={**base, **(env or {})},
                              catch_exceptions=False)  # fmt: skip


def target(url: str) -> tether.App:
    app = tether.App(url)

    @app.workflow()
    async def wire(title: str, required: int, duties: bool) -> str:
        decision = await tether.approval(
            title,
            f"Send it. {title}",
            operation={"tool": f"wire {title}", "arguments": {"amount": 1_000_000, "memo": title}},
            options=(*tether.APPROVE_REJECT, tether.Option("hold", f"Hold: {title}")),
            reviewers=["group:treasury"],
            required=required,
            separate_duties=duties,
        )
        return decision.status

    return app


def ask(url: str, run_id: str, title: str = "Wire $1M?", *, required: int = 1,
        duties: bool = False, started_by: str | None = None) -> tether.Approval:  # fmt: skip
    """Start `wire` and work it until it waits for its approval."""

    async def main() -> tether.Approval:
        async with target(url) as app:
            await app.start("wire", title, required, duties, id=run_id, started_by=started_by)
            async with asyncio.timeout(10):
                while not (found := await app.list_approvals(run_id=run_id)):
                    await asyncio.sleep(0.01)
            return found[0]

    return asyncio.run(main())


def people(url: str, *names: str, groups: frozenset[str] = frozenset({"treasury"})) -> list[str]:
    """Add users and return their tokens, in order."""

    async def main() -> list[str]:
        app = tether.App(url)
        try:
            await app.open()
            return [(await add_user(app.engine, name, groups))[1] for name in names]
        finally:
            await app.close()

    return asyncio.run(main())


def library(url: str, call: str, *args: Any) -> Any:
    async def main() -> Any:
        app = tether.App(url)
        try:
            return await getattr(app, call)(*args)
        finally:
            await app.close()

    return asyncio.run(main())


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/cli-attacks.db"


def approve(url: str, a: tether.Approval, *extra: str, env: dict[str, str | None] | None = None
            ) -> Result:  # fmt: skip
    return tether_cli("approvals", "--database", url, "approve", a.id,
                      "--digest", a.operation_digest, *extra, env=env)  # fmt: skip


# -- authenticated decisions -----------------------------------------------------------------------


def test_one_token_used_twice_does_not_satisfy_a_two_person_separate_duties_approval(
    url: str,
) -> None:
    alice, bob, carol = people(url, "alice", "bob", "carol")
    a = ask(url, "wire-1", required=2, duties=True, started_by="carol")
    first = approve(url, a, "--token", alice)
    assert first.exit_code == 0, first.output
    assert first.output.strip() == f"{a.id}: pending: 1 of 2 approvals (alice)"
    with attack("cli decisions"):  # the same token again, by flag and by environment
        again = approve(url, a, "--token", alice)
        assert again.exit_code == 1, again.output
        assert again.stderr.startswith("refused (already_voted): ")
        from_env = approve(url, a, env={"TETHER_TOKEN": alice})
        assert from_env.exit_code == 1, from_env.output
        assert library(url, "get_approval", a.id).status == "pending"
    with attack("cli decisions"):  # alice's token, claiming to be bob
        claimed = approve(url, a, "--token", alice, "--as", "bob")
        assert claimed.exit_code == 2, claimed.output
        assert "decisions are authenticated: pass --token or set TETHER_TOKEN" in claimed.output
        claimed_group = approve(url, a, "--token", alice, "--group", "treasury")
        assert claimed_group.exit_code == 2, claimed_group.output
        assert library(url, "get_approval", a.id).approvers == ("alice",)
    with attack("cli decisions"):  # the run's starter, with a real token of her own
        starter = approve(url, a, "--token", carol)
        assert starter.exit_code == 1, starter.output
        assert starter.stderr.startswith("refused (separate_duties): ")
        assert library(url, "get_approval", a.id).status == "pending"
    second = approve(url, a, "--token", bob)  # a second person: now it holds
    assert second.exit_code == 0, second.output
    assert second.output.strip() == f"{a.id}: approved by bob (approvers: alice, bob)"
    entries = library(url, "approval_history", a.id)
    votes = [e for e in entries if e.event in ("voted", "decided")]
    assert {e.actor for e in votes} == {"alice", "bob"}
    for e in entries[1:]:  # every entry the CLI wrote says it came from the CLI, and whence
        assert e.detail["channel"] == "cli", e
        assert e.detail["client"].startswith("cli "), e
        assert " pid " in e.detail["client"], e


@pytest.mark.parametrize("how", ["no token", "forged", "revoked", "another database",
                                 "a name as the token"])  # fmt: skip
def test_a_decision_without_a_valid_token_decides_nothing(
    url: str, tmp_path: Path, how: str
) -> None:
    [alice] = people(url, "alice")
    a = ask(url, "wire-2")
    other = f"sqlite:///{tmp_path}/other.db"
    [foreign] = people(other, "alice")
    tokens = {"no token": None, "forged": "tt_" + "A" * 43, "revoked": alice,
              "another database": foreign, "a name as the token": "alice"}  # fmt: skip
    if how == "revoked":
        revoked = tether_cli("users", "--database", url, "revoke", "alice")
        assert revoked.exit_code == 0, revoked.output
    token = tokens[how]
    with attack("cli decisions"):
        result = approve(url, a, *(["--token", token] if token else []))
        assert result.exit_code == 1, result.output
        if token is None:
            assert "decisions are authenticated" in result.stderr
        else:
            assert "is not valid in this database" in result.stderr
            assert token not in result.output  # a token is never echoed
        assert library(url, "get_approval", a.id).status == "pending"
        assert [e.event for e in library(url, "approval_history", a.id)] == ["created"]


def test_a_stored_credential_decides_and_one_others_can_read_is_refused(
    url: str, config_home: Path
) -> None:
    [alice] = people(url, "alice")
    a = ask(url, "wire-3")
    login = CliRunner().invoke(cli, ["login", "--database", url], input=alice + "\n",
                               env={"TETHER_TOKEN": None}, catch_exceptions=False)  # fmt: skip
    assert login.exit_code == 0, login.output
    assert alice not in login.output  # read without echo, never printed
    stored = config_home / "tether" / "credentials"
    assert stored.stat().st_mode & 0o777 == 0o600
    assert (config_home / "tether").stat().st_mode & 0o777 == 0o700
    with attack("cli decisions"):  # a credentials file that others may read is not used
        stored.chmod(0o644)
        leaked = approve(url, a)
        assert leaked.exit_code == 1, leaked.output
        assert "may be read by others" in leaked.stderr
        assert library(url, "get_approval", a.id).status == "pending"
    stored.chmod(0o600)
    decided = approve(url, a)
    assert decided.exit_code == 0, decided.output
    assert decided.output.strip() == f"{a.id}: approved by alice"
    logout = tether_cli("logout")
    assert logout.exit_code == 0
    assert not stored.exists()


# -- hostile text in the CLI -----------------------------------------------------------------------


def test_terminal_escapes_bidi_and_zero_width_text_never_reach_the_terminal_raw(url: str) -> None:
    [alice] = people(url, "alice")
    a = ask(url, "wire-\u202e\x1b[2J", HOSTILE)
    rejected = tether_cli("approvals", "--database", url, "reject", a.id, "--token", alice,
                          "--digest", a.operation_digest, "--comment", HOSTILE)  # fmt: skip
    assert rejected.exit_code == 0, rejected.output
    db = ["approvals", "--database", url]
    commands = [[*db, "list", "--status", "all"], [*db, "list", "--status", "all", "--json"],
                [*db, "show", a.id], [*db, "show", a.id, "--json"], [*db, "history", a.id],
                [*db, "history", a.id, "--json"], [*db, "show", "ap-\x1b[2J\u202e"],
                [*db, "approve", a.id, "--token", alice, "--digest", a.operation_digest],
                ["runs", "--database", url, "list"],
                ["runs", "--database", url, "show", a.run_id],
                ["runs", "--database", url, "show", a.run_id + "\x1b]0;x\x07"]]  # fmt: skip
    for args in commands:
        with attack("cli text"):
            result = tether_cli(*args)
            assert result.exit_code in (0, 1), (args, result.output)
            assert raw_controls(result.output) == [], (args, result.output)
    shown = tether_cli(*db, "show", a.id)
    # Shown, visibly: the reviewer sees that something is there, and markup stays text.
    assert "[bold]markup[/bold]" in shown.output
    assert "U+202E" in shown.output
    assert "<U+001B>" in shown.output


def test_a_secret_in_a_title_or_comment_is_not_shown_by_the_cli(url: str) -> None:
    [alice] = people(url, "alice")
    a = ask(url, "wire-secret", f"Rotate {OPENAI_KEY} now?")
    comment = f"rotated; new one is {ANTHROPIC_KEY}, old token {JWT}"
    rejected = tether_cli("approvals", "--database", url, "reject", a.id, "--token", alice,
                          "--digest", a.operation_digest, "--comment", comment)  # fmt: skip
    assert rejected.exit_code == 0, rejected.output
    db = ["approvals", "--database", url]
    for args in ([*db, "list", "--status", "all"], [*db, "show", a.id], [*db, "history", a.id],
                 [*db, "history", a.id, "--json"]):  # fmt: skip
        with attack("cli text"):
            result = tether_cli(*args)
            assert result.exit_code == 0, (args, result.output)
            assert leaks(result.output) == [], (args, result.output)
            assert "[redacted]" in result.output, (args, result.output)  # it was there


# -- log forgery -----------------------------------------------------------------------------------

LOGGING_APP = """
import tether
from tether.approvals import LogNotifier

app = tether.App({url!r}, notifiers=[LogNotifier()])

@app.workflow()
async def wire(title: str) -> str:
    decision = await tether.approval(title, operation={{"tool": "wire"}}, reviewers=["root"])
    return decision.status
"""
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def test_a_newline_in_a_title_or_run_id_forges_no_line_in_the_worker_log(
    url: str, tmp_path: Path
) -> None:
    (tmp_path / "cli_log_app.py").write_text(LOGGING_APP.format(url=url))
    title = f"Wire $1M?\n{FORGED}\r\n{FORGED}\x1b[1A\x1b[2K key {OPENAI_KEY}"
    run_id = f"wire-log\n{FORGED}"

    async def start() -> None:
        app = tether.App(url)  # opened without its worker: the worker process runs it

        @app.workflow()
        async def wire(title: str) -> str:
            raise AssertionError("this App has no worker")

        await app.start(wire, title, id=run_id)
        await app.close()

    asyncio.run(start())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-m", "tether", "worker", "cli_log_app:app"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not library(url, "list_approvals") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the notifier logs right after the approval is stored
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    asked = [line for line in err.splitlines() if "asked of root" in line]
    assert len(asked) == 1, err  # the record was logged: the checks below are not vacuous
    with attack("log forgery"):
        lines = err.splitlines()
        for line in lines:  # each record is one line, or a traceback's indented continuation
            assert LOG_LINE.match(line) or line.startswith(("  ", "Traceback")), line
        assert not [line for line in lines if line.startswith(FORGED[:23])], err
        assert raw_controls(err) == [], err
    with attack("log forgery"):  # a secret in a title is not written to the log
        assert leaks(err) == [], err


def fail(message: str) -> None:
    raise ValueError(message)


def test_an_error_message_extra_or_argument_forges_no_line_and_leaks_no_key() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = install_logging(stream=stream)
    log = logging.getLogger("tether.attack")
    try:
        log.info("approval %s by %s", "ap-1", f"root\n{FORGED}")
        log.warning("step failed", extra={"run_id": f"r\n{FORGED}", "workflow": "w", "step": "s"})
        log.info("%s", f"a str subclass\n{FORGED}")
        try:
            fail(f"bad input\n{FORGED}\rkey {OPENAI_KEY}")
        except ValueError:
            log.exception("step %s failed", f"s\n{FORGED}")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    written = stream.getvalue()
    assert written.count("Traceback (most recent call last):") == 1, written
    with attack("log forgery"):
        lines = written.splitlines()
        for line in lines:
            assert LOG_LINE.match(line) or line.startswith(("  ", "Traceback")), line
        assert not [line for line in lines if line.startswith(FORGED[:23])], written
        assert len([line for line in lines if LOG_LINE.match(line)]) == 4, written
        assert raw_controls(written) == [], written
        assert leaks(written) == [], written
