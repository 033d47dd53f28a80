"""`tether approvals` against a real SQLite file: listing, showing (redacted, audited as the
token's user), deciding as the user of a token bound to the digest (refusals exit 1 with their
reason), cancelling, quorums, custom options, history, verifying the audit chain after
tampering, and user text printed literally, control characters made visible."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import sqlite3
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from rich.text import Text

import tether
from tether.cli import cli
from tether.cli.common import SafeConsole
from tether.users import add_user

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TETHER_DATABASE_URL": None, "TETHER_TOKEN": None}
EDIT = tether.Option(
    "edit",
    "Edit",
    schema={"type": "object", "required": ["arguments"],
            "properties": {"arguments": {"type": "object"}}},
)  # fmt: skip


def invoke(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={**ENV, **(env or {})},
                              catch_exceptions=False)  # fmt: skip


def approval_app(url: str) -> tether.App:
    app = tether.App(url)

    @app.step()
    async def deploy(version: str) -> str:
        return f"deployed {version}"

    @app.workflow()
    async def release(
        version: str, title: str = "Deploy to prod?", required: int = 1
    ) -> dict[str, Any]:
        decision = await tether.approval(
            title,
            "The agent wants to deploy.",
            options=(*tether.APPROVE_REJECT, EDIT),
            operation={"tool": "deploy", "arguments": {"version": version}},
            reviewers=["alice", "bob", "group:sre"],
            context={"password": "hunter2", "changelog": "fix login"},
            required=required,
        )
        if decision.approved:
            return {"status": decision.status, "result": await deploy(version)}
        return {"status": decision.status, "operation": decision.operation}

    return app


def start_pending(url: str, run_id: str, **kwargs: Any) -> tether.Approval:
    """Run `release` with a worker until it waits for its approval; the run stays waiting."""

    async def main() -> tether.Approval:
        async with approval_app(url) as app:
            await app.start("release", "1.2.3", id=run_id, **kwargs)
            async with asyncio.timeout(10):
                while not (found := await app.list_approvals(run_id=run_id)):
                    await asyncio.sleep(0.01)
            return found[0]

    return asyncio.run(main())


def finish(url: str, run_id: str) -> Any:
    """The run's result, once a worker resumed it after its decision."""

    async def main() -> Any:
        async with approval_app(url) as app:
            return await (await app.get(run_id)).result(timeout=10)

    return asyncio.run(main())


def library(url: str, call: str, *args: Any) -> Any:
    async def main() -> Any:
        app = tether.App(url)
        try:
            return await getattr(app, call)(*args)
        finally:
            await app.close()

    return asyncio.run(main())


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A credentials directory of the test's own: never the real user's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/approvals.db"


@pytest.fixture
def token(url: str) -> dict[str, str]:
    """The tokens of alice, bob (no groups), carol (group sre) and mallory (asked of nothing)."""

    async def main() -> dict[str, str]:
        app = tether.App(url)
        try:
            await app.open()
            return {name: (await add_user(app.engine, name, frozenset(groups)))[1]
                    for name, groups in [("alice", ()), ("bob", ()), ("carol", ("sre",)),
                                         ("mallory", ())]}  # fmt: skip
        finally:
            await app.close()

    return asyncio.run(main())


@pytest.fixture
def ask(url: str) -> tether.Approval:
    """One pending approval, of the run rel-1."""
    return start_pending(url, "rel-1")


def ap(url: str, *args: str) -> Result:
    return invoke("approvals", "--database", url, *args)


def test_list_shows_the_pending_approval_as_a_table_row(url: str, ask: tether.Approval) -> None:
    result = ap(url, "list")
    assert result.exit_code == 0, result.output
    header, row = [line.strip() for line in result.output.splitlines() if line.strip()]
    assert header.split() == ["id", "title", "status", "run", "reviewers", "expires"]
    assert row.startswith(f"{ask.id}  Deploy to prod?  pending  rel-1  alice, bob, group:sre")
    assert re.search(r"  in 23h 5\dm$", row), row  # expires in a day


def test_list_json_is_an_array_of_approvals_with_iso_times(url: str, ask: tether.Approval) -> None:
    result = ap(url, "list", "--json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert (row["id"], row["status"], row["run_id"]) == (ask.id, "pending", "rel-1")
    assert row["operation_digest"] == ask.operation_digest
    assert row["reviewers"] == ["alice", "bob", "group:sre"]
    assert [o["id"] for o in row["options"]] == ["approve", "reject", "edit"]
    assert [o["takes_response"] for o in row["options"]] == [False, False, True]
    assert datetime.fromisoformat(row["expires_at"]) == ask.expires_at
    assert row["decision"] is None
    assert "hunter2" not in result.output


def test_list_filters_by_status_run_and_reviewer(url: str, ask: tether.Approval) -> None:
    def ids(*args: str) -> list[str]:
        result = ap(url, "list", "--json", *args)
        assert result.exit_code == 0, result.output
        return [row["id"] for row in json.loads(result.output)]

    assert ids("--status", "all") == [ask.id]
    assert ids("--status", "approved") == []
    assert ids("--run", "rel-1") == [ask.id]
    assert ids("--run", "other") == []
    assert ids("--reviewer", "alice") == [ask.id]
    assert ids("--reviewer", "carol") == []
    assert ids("--reviewer", "carol", "--group", "sre") == [ask.id]
    none = ap(url, "list", "--status", "rejected")
    assert none.exit_code == 0
    assert none.output.strip() == "no rejected approvals"
    lone_group = ap(url, "list", "--group", "sre")
    assert lone_group.exit_code == 2
    assert "--group needs --reviewer" in lone_group.output
    bad_status = ap(url, "list", "--status", "done")
    assert bad_status.exit_code == 2


def test_show_prints_what_a_reviewer_needs_with_secrets_redacted(
    url: str, ask: tether.Approval
) -> None:
    result = ap(url, "show", ask.id)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "hunter2" not in out
    assert '"password": "[redacted]"' in out
    assert '"changelog": "fix login"' in out
    assert '"version": "1.2.3"' in out
    assert out.splitlines()[:2] == ["Deploy to prod?", "The agent wants to deploy."]
    for label, value in [("status", "pending"), ("run", "rel-1 (step approval)"),
                         ("digest", ask.operation_digest),
                         ("reviewers", "alice, bob, group:sre")]:  # fmt: skip
        assert [label, value] in [line.rstrip().split(None, 1) for line in out.splitlines()]
    options = [line.split() for line in out.splitlines() if line.split()[:1] == ["edit"]]
    assert options == [["edit", "Edit", "default", "JSON", "(see", "its", "schema)"]]
    command = f"approve {ask.id} --digest {ask.operation_digest}"
    assert f"tether approvals --database {url} {command}" in out
    assert f"reject {ask.id} --digest {ask.operation_digest}" in out
    assert "--as" not in out
    assert f"{command} --option edit --response JSON" in out
    as_json = ap(url, "show", ask.id, "--json")
    doc = json.loads(as_json.output)
    assert doc["context"] == {"password": "[redacted]", "changelog": "fix login"}
    assert doc["operation_digest"] == ask.operation_digest
    assert "hunter2" not in as_json.output
    assert len(doc["commands"]) == 3


def test_show_with_the_default_database_prints_the_command_without_database_options(
    url: str, ask: tether.Approval
) -> None:
    result = CliRunner().invoke(cli, ["approvals", "show", ask.id], catch_exceptions=False,
                                env={**ENV, "TETHER_DATABASE_URL": url})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"  tether approvals approve {ask.id} --digest" in result.output


def test_show_with_a_token_records_a_viewed_entry_of_its_user(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    assert [e.event for e in library(url, "approval_history", ask.id)] == ["created"]
    plain = ap(url, "show", ask.id)
    assert plain.exit_code == 0
    assert [e.event for e in library(url, "approval_history", ask.id)] == ["created"]
    claimed = ap(url, "show", ask.id, "--as", "carol")
    assert claimed.exit_code == 2
    assert "decisions are authenticated" in claimed.output
    viewed = ap(url, "show", ask.id, "--token", token["carol"])  # carol: in group sre
    assert viewed.exit_code == 0, viewed.output
    lines = [line.split() for line in viewed.output.splitlines()]
    assert ["you", "carol"] in lines
    assert ["you", "may", "decide", "yes"] in lines
    history = json.loads(ap(url, "history", ask.id, "--json").output)
    assert [(e["seq"], e["event"], e["actor"]) for e in history] == [
        (1, "created", None), (2, "viewed", "carol"),
    ]  # fmt: skip
    assert history[1]["detail"]["channel"] == "cli"
    assert history[1]["detail"]["client"].startswith("cli ")
    assert all(datetime.fromisoformat(e["at"]) for e in history)
    table = ap(url, "history", ask.id)
    assert table.exit_code == 0
    # The detail column folds over several lines: a row starts with its number.
    header, *rows = [line.split() for line in table.output.splitlines() if line[:3].strip()]
    assert header == ["#", "at", "event", "actor", "detail"]
    created, viewed_row = rows
    assert created[0] == "1"
    assert created[3] == "created"
    assert viewed_row[0] == "2"
    assert viewed_row[3:6] == ["viewed", "carol", '{"channel":']


def test_approving_with_a_stale_digest_is_refused_and_leaves_it_pending(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    result = ap(url, "approve", ask.id, "--token", token["alice"], "--digest", "0" * 64)
    assert result.exit_code == 1
    assert result.stderr.startswith("refused (stale_digest): ")
    assert "Traceback" not in result.output
    assert library(url, "get_approval", ask.id).status == "pending"
    refused = library(url, "approval_history", ask.id)[-1]
    assert (refused.event, refused.actor, refused.detail["reason"]) == (
        "refused", "alice", "stale_digest",
    )  # fmt: skip


def test_approving_with_the_digest_shown_completes_the_run(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    show = ap(url, "show", ask.id)
    [line] = [x for x in show.output.splitlines() if f"approve {ask.id} --digest" in x
              and "--option" not in x]  # fmt: skip
    words = shlex.split(line)
    assert words[:2] == ["tether", "approvals"]
    result = invoke(*words[1:], "--comment", "ship [it]", env={"TETHER_TOKEN": token["alice"]})
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{ask.id}: approved by alice"
    assert finish(url, "rel-1") == {"status": "approved", "result": "deployed 1.2.3"}
    shown = ap(url, "show", ask.id)
    assert "ship [it]" in shown.output
    assert "to decide" not in shown.output
    again = ap(url, "approve", ask.id, "--token", token["bob"], "--digest", ask.operation_digest)
    assert again.exit_code == 1
    assert again.stderr.startswith("refused (already_decided): ")


def test_rejecting_reaches_the_run(url: str, ask: tether.Approval, token: dict[str, str]) -> None:
    result = ap(url, "reject", ask.id, "--token", token["bob"], "--digest", ask.operation_digest,
                "--comment", "not today", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    decision = json.loads(result.output)
    assert (decision["status"], decision["reviewer"], decision["comment"]) == (
        "rejected", "bob", "not today",
    )  # fmt: skip
    assert datetime.fromisoformat(decision["decided_at"])
    assert finish(url, "rel-1")["status"] == "rejected"
    listed = ap(url, "list", "--status", "rejected")
    assert ask.id in listed.output


def test_a_reviewer_who_is_not_asked_is_refused_and_a_group_admits(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    result = ap(
        url, "approve", ask.id, "--token", token["mallory"], "--digest", ask.operation_digest
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("refused (wrong_reviewer): ")
    assert "'mallory'" in result.stderr
    ok = ap(url, "approve", ask.id, "--token", token["carol"],
            "--digest", ask.operation_digest)  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert ok.output.strip() == f"{ask.id}: approved by carol"


def test_a_quorum_counts_votes_until_enough_distinct_reviewers_approved(
    url: str, token: dict[str, str]
) -> None:
    ask = start_pending(url, "rel-q", required=2)
    first = ap(url, "approve", ask.id, "--token", token["alice"], "--digest", ask.operation_digest)
    assert first.exit_code == 0, first.output
    assert first.output.strip() == f"{ask.id}: pending: 1 of 2 approvals (alice)"
    listed = ap(url, "list")
    assert listed.output.splitlines()[0].split()[-1] == "approvals"
    assert listed.output.rstrip().endswith("1 of 2 approvals (alice)")
    twice = ap(url, "approve", ask.id, "--token", token["alice"], "--digest", ask.operation_digest)
    assert twice.exit_code == 1
    assert twice.stderr.startswith("refused (already_voted): ")
    second = ap(url, "approve", ask.id, "--token", token["bob"], "--digest", ask.operation_digest)
    assert second.exit_code == 0, second.output
    assert second.output.strip() == f"{ask.id}: approved by bob (approvers: alice, bob)"
    assert finish(url, "rel-q")["status"] == "approved"


def test_a_custom_option_takes_a_json_response(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    digest = ask.operation_digest
    bad_json = ap(url, "approve", ask.id, "--token", token["alice"], "--digest", digest, "--option",
                  "edit", "--response", "{arguments: 1}")  # fmt: skip
    assert bad_json.exit_code == 2
    assert "is not JSON text" in bad_json.output
    invalid = ap(url, "approve", ask.id, "--token", token["alice"], "--digest", digest, "--option",
                 "edit", "--response", '{"version": "2"}')  # fmt: skip
    assert invalid.exit_code == 1
    assert invalid.stderr.startswith("refused (invalid_response): ")
    unknown = ap(
        url, "approve", ask.id, "--token", token["alice"], "--digest", digest, "--option", "nope"
    )
    assert unknown.stderr.startswith("refused (unknown_option): ")
    edit = ap(url, "approve", ask.id, "--token", token["alice"], "--digest", digest,
              "--option", "edit", "--response", '{"arguments": {"version": "1.2.4"}}')  # fmt: skip
    assert edit.exit_code == 0, edit.output
    assert edit.output.strip() == f"{ask.id}: edit by alice"
    assert finish(url, "rel-1") == {
        "status": "edit", "operation": {"tool": "deploy", "arguments": {"version": "1.2.4"}},
    }  # fmt: skip
    shown = ap(url, "show", ask.id)
    assert '"version": "1.2.4"' in shown.output  # the response, under the decision


def test_deciding_needs_a_token_and_the_digest(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    no_digest = ap(url, "approve", ask.id, "--token", token["alice"])
    assert no_digest.exit_code == 2
    assert "--digest" in no_digest.output
    no_token = ap(url, "reject", ask.id, "--digest", ask.operation_digest)
    assert no_token.exit_code == 1
    assert no_token.stderr.startswith("error: decisions are authenticated: pass --token or "
                                      "set TETHER_TOKEN")  # fmt: skip
    for claim in (["--as", "alice"], ["--group", "sre"]):
        claimed = ap(url, "approve", ask.id, *claim, "--digest", ask.operation_digest)
        assert claimed.exit_code == 2
        assert "decisions are authenticated: pass --token or set TETHER_TOKEN" in claimed.output
        assert "see `tether users add`" in claimed.output
    assert library(url, "get_approval", ask.id).status == "pending"
    assert [e.event for e in library(url, "approval_history", ask.id)] == ["created"]


@pytest.mark.parametrize(
    "command",
    [["show"], ["history"], ["verify"], ["approve", "--digest", "d"],
     ["reject", "--digest", "d"], ["cancel"]],
)  # fmt: skip
def test_an_unknown_approval_id_exits_1_naming_it(
    url: str, ask: tether.Approval, token: dict[str, str], command: list[str]
) -> None:
    result = invoke("approvals", "--database", url, command[0], "ap-nope", *command[1:],
                    env={"TETHER_TOKEN": token["alice"]})  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no approval has id 'ap-nope'")
    assert "Traceback" not in result.output


def test_approvals_of_a_database_that_does_not_exist_create_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.db"
    result = invoke("approvals", "--database", f"sqlite:///{missing}", "list")
    assert result.exit_code == 1
    assert "no database at" in result.stderr
    assert not missing.exists()


def test_verify_passes_an_intact_trail_and_names_a_tampered_one(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    other = start_pending(url, "rel-2")
    approved = ap(
        url, "approve", ask.id, "--token", token["alice"], "--digest", ask.operation_digest
    )
    assert approved.exit_code == 0, approved.output
    intact = ap(url, "verify")
    assert intact.exit_code == 0, intact.output
    assert intact.output.strip() == "2 approvals verified, 0 broken"
    assert json.loads(ap(url, "verify", "--json").output) == {"verified": 2, "broken": []}
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE tether_approval_audit SET detail = ? WHERE approval_id = ? AND event = ?",
            ('{"reviewer": "mallory"}', ask.id, "decided"),
        )
    db.close()
    broken = ap(url, "verify")
    assert broken.exit_code == 1
    first, summary = broken.output.strip().splitlines()
    assert first.startswith(f"{ask.id}: entry 2 (decided) was altered")
    assert summary == "2 approvals verified, 1 broken"
    as_json = ap(url, "verify", "--json")
    assert as_json.exit_code == 1
    [row] = json.loads(as_json.output)["broken"]
    assert row["id"] == ask.id
    assert "altered" in row["problems"][0]
    one = ap(url, "verify", other.id)
    assert one.exit_code == 0
    assert one.output.strip() == "1 approvals verified, 0 broken"


def test_user_text_with_rich_markup_prints_literally(url: str, token: dict[str, str]) -> None:
    title = "[red]boom[/red] [bogus style]x[/] :smile:"
    ask = start_pending(url, "rel-m", title=title)
    listed = ap(url, "list")
    assert listed.exit_code == 0, listed.output
    assert title in listed.output
    shown = ap(url, "show", ask.id)
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[0] == title
    comment = "[bold]fine[/bold]"
    ap(
        url,
        "reject",
        ask.id,
        "--token",
        token["bob"],
        "--digest",
        ask.operation_digest,
        "--comment",
        comment,
    )
    assert comment in ap(url, "show", ask.id).output
    assert comment in ap(url, "history", ask.id).output


def test_approvals_with_app_uses_its_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, ask: tether.Approval
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "cli_approvals_app", raising=False)
    (tmp_path / "cli_approvals_app.py").write_text(
        textwrap.dedent(f"""
        import tether
        app = tether.App({url!r})
    """)
    )
    result = invoke("approvals", "--app", "cli_approvals_app:app", "show", ask.id)
    assert result.exit_code == 0, result.output
    assert f"tether approvals --app cli_approvals_app:app approve {ask.id}" in result.output
    sys.modules.pop("cli_approvals_app", None)


def test_cancel_withdraws_it_as_a_reviewer_and_refuses_others(
    url: str, ask: tether.Approval, token: dict[str, str]
) -> None:
    stranger = ap(url, "cancel", ask.id, "--token", token["mallory"])
    assert stranger.exit_code == 1
    assert stranger.stderr.startswith("refused (wrong_reviewer): 'mallory' may not cancel")
    assert library(url, "get_approval", ask.id).status == "pending"
    anonymous = ap(url, "cancel", ask.id)
    assert anonymous.exit_code == 1
    assert "decisions are authenticated" in anonymous.stderr
    done = ap(url, "cancel", ask.id, "--token", token["carol"], "--reason", "superseded")
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"{ask.id}: cancelled"
    assert finish(url, "rel-1")["status"] == "cancelled"
    last = library(url, "approval_history", ask.id)[-1]
    assert (last.actor, last.detail["channel"]) == ("carol", "cli")
    again = ap(url, "cancel", ask.id, "--token", token["carol"])
    assert again.exit_code == 1
    assert again.stderr.startswith("refused (")


def test_login_stores_the_token_0600_and_logout_removes_it(
    url: str, ask: tether.Approval, token: dict[str, str], config_home: Path
) -> None:
    wrong = invoke("login", "--database", url, "--token", "tt_nope")
    assert wrong.exit_code == 1
    assert "is not valid in this database" in wrong.stderr
    stored = config_home / "tether" / "credentials"
    assert not stored.exists()
    ok = invoke("login", "--database", url, env={"TETHER_TOKEN": token["carol"]})
    assert ok.exit_code == 0, ok.output
    assert ok.stderr.startswith("signed in as carol (groups: sre); token stored in ")
    assert token["carol"] not in ok.output
    assert stored.stat().st_mode & 0o777 == 0o600
    assert json.loads(stored.read_text())["token"] == token["carol"]
    shown = ap(url, "show", ask.id)  # the stored token is used: the view is carol's
    assert ["you", "carol"] in [line.split() for line in shown.output.splitlines()]
    # --token (or $TETHER_TOKEN) wins over the stored one.
    decided = ap(url, "approve", ask.id, "--token", token["alice"], "--digest",
                 ask.operation_digest)  # fmt: skip
    assert decided.output.strip() == f"{ask.id}: approved by alice"
    out = invoke("logout")
    assert out.exit_code == 0
    assert out.stderr.startswith("signed out: removed ")
    assert not stored.exists()
    assert invoke("logout").stderr.startswith("not signed in")


def test_the_console_shows_control_characters_and_keeps_its_own_styles() -> None:
    # A real terminal, with colours: what rich writes itself must survive the net.
    file = io.StringIO()
    out = SafeConsole(file=file, force_terminal=True, color_system="standard", markup=False)
    out.print(Text("ok", style="red") + Text(" \x1b[2J\u202eevil\u200b\x9b"))
    written = file.getvalue()
    assert written.count("\x1b") == 2, repr(written)  # the style's on and off, nothing else
    assert "<U+001B>[2J<U+202E>evil<U+200B><U+009B>" in written, repr(written)


def test_a_long_title_stays_on_its_row_when_the_list_is_piped(url: str) -> None:
    title = "Deploy release 1.2.3 of the payments service to the production cluster in eu-west?"
    approval = start_pending(url, "rel-long", title=title)
    # CliRunner's output is no terminal, as a pipe is not; no $COLUMNS says a width.
    result = invoke("approvals", "--database", url, "list", env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if approval.id in line]
    assert len(rows) == 1, result.output
    assert title in rows[0], result.output


@pytest.mark.parametrize("where", ["top", "after"])
def test_show_names_a_database_given_before_or_after_it_in_its_commands(
    url: str, ask: tether.Approval, where: str
) -> None:
    args = (["-d", url, "approvals", "show", ask.id] if where == "top"
            else ["approvals", "show", ask.id, "-d", url])  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert f"tether approvals --database {url} approve {ask.id} --digest" in result.output
