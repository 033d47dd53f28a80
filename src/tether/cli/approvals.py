"""`tether approvals list | show | approve | reject | cancel | history | verify`: what reviewers
and auditors do from a terminal: find approvals, read one (redacted), decide it as the user whose
token they hold, bound to the digest they saw, and read or verify the hash-chained audit trail.

It must not judge a decision, write the audit trail or talk SQL: App.decide and the store's rules
do that; nor take a reviewer's name on trust (tether.cli.credentials). It parses, calls the App
with channel `cli`, and renders user text literally, with control characters made visible.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import click
from rich.highlighter import JSONHighlighter
from rich.text import Text

from tether.app import App
from tether.approvals.model import Approval, Decision, Reviewer
from tether.cli.common import (
    CliError,
    F,
    chosen,
    console,
    database_options,
    fields_grid,
    new_table,
    relative_time,
    run_with_app,
    short_time,
    shown,
    status_text,
)
from tether.cli.credentials import (
    UNAUTHENTICATED,
    cli_client,
    no_claimed_reviewer,
    signed_in,
    token_option,
    token_source,
)
from tether.errors import ApprovalRefused
from tether.redact import redact, redact_text
from tether.views import approval_json, decision_json, history_json, takes_response

STATUSES = ("pending", "approved", "rejected", "expired", "cancelled", "all")
OPEN = ("pending", "expired")  # statuses whose expiry still matters


class Refused(CliError):
    """A decision the library refused: `refused (<reason>): <message>` on stderr, exit 1."""

    prefix = ""


def json_text(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """An option value given as JSON text, decoded (a usage error, exit 2, if it is not JSON)."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        example = """'{"arguments": {"version": "1.2.4"}}'"""
        raise click.BadParameter(
            f"{value!r} is not JSON text ({exc.msg} at character {exc.pos}); quote it whole "
            f"for the shell, e.g. {example}",
            ctx,
            param,
        ) from None


# -- JSON and text forms ----------------------------------------------------------------------


def pretty_json(value: object) -> Text:
    """Indented, highlighted JSON as plain text: nothing in it is read as markup."""
    return JSONHighlighter()(Text(json.dumps(value, indent=2, ensure_ascii=False)))


def votes_text(a: Approval) -> str:
    """`1 of 2 approvals (alice)`: the quorum so far."""
    names = f" ({', '.join(a.approvers)})" if a.approvers else ""
    return f"{len(a.approvers)} of {a.required} approvals{names}"


def decide_commands(ctx: click.Context, a: Approval) -> list[str]:
    """The commands that decide `a` as its options allow, with the database options this
    command was given, so they can be pasted as they are."""
    chose = ctx.obj  # how the pasteable commands choose this database, as this one did
    prefix = (["--app", chose["app"]] if chose["app"]
              else ["--database", chose["database"]] if chose["given"] else [])  # fmt: skip
    base = " ".join(["tether", "approvals", *map(shlex.quote, prefix)])
    # Quoted for the shell, then made visible: an id holding an escape is shown, not obeyed.
    tail = f"{shlex.quote(a.id)} --digest {shlex.quote(a.operation_digest)}"
    lines = []
    for option in a.options:
        response = " --response JSON" if takes_response(option, a) else ""
        if option.id in ("approve", "reject"):
            lines.append(f"{base} {option.id} {tail}{response}")
        else:
            lines.append(f"{base} approve {tail} --option {shlex.quote(option.id)}{response}")
    return lines


def said(text: str, style: str = "", *, lines: bool = False) -> Text:
    """Free text people wrote (a title, a description, a comment) as shown: secret shapes in it
    redacted, like the operation, and hostile characters made visible."""
    return shown(redact_text(text), style, lines=lines)


# -- options ----------------------------------------------------------------------------------


def reviewer_of(name: str | None, groups: tuple[str, ...], flag: str) -> Reviewer | None:
    if name is None:
        if groups:
            raise click.UsageError(f"--group needs {flag} NAME: it names that reviewer's groups")
        return None
    return Reviewer(name, frozenset(groups))


def group_option(command: F) -> F:
    return click.option(
        "--group",
        "groups",
        multiple=True,
        metavar="G",
        help="A group the reviewer belongs to (repeat for several): admits approvals whose "
        "reviewers include `group:G`.",
    )(command)


def decide_options(command: F) -> F:
    """--token, --digest and --comment: who decides (the token's owner), bound to what they
    saw; --as and --group are refused with the reason."""
    command = no_claimed_reviewer(command)
    command = token_option(command)
    command = click.option(
        "--comment", metavar="TEXT", help="Why; kept with the decision and in the audit trail."
    )(command)
    return click.option(
        "--digest",
        required=True,
        metavar="DIGEST",
        help="The operation digest that `tether approvals show ID` printed. It binds your "
        "decision to the operation you saw: if the operation differs, the decision is refused "
        "(stale_digest).",
    )(command)


# -- commands ---------------------------------------------------------------------------------


@click.group()
@database_options
@click.pass_context
def approvals(ctx: click.Context, database: str, app_ref: str | None) -> None:
    """List, inspect and decide approvals; read and verify their audit trails."""
    ctx.obj = chosen(ctx, database, app_ref)


@approvals.command("list")
@click.option(
    "--status",
    "-s",
    type=click.Choice(STATUSES),
    default="pending",
    show_default=True,
    help="Only approvals in this status (`all`: any). A pending approval past its expiry "
    "counts as expired.",
)
@click.option("--run", "run_id", metavar="RUN", help="Only the approvals of this run.")
@click.option("--reviewer", metavar="NAME", help="Only approvals this reviewer may decide.")
@group_option
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many approvals, oldest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.pass_context
def approvals_list(
    ctx: click.Context,
    status: str,
    run_id: str | None,
    reviewer: str | None,
    groups: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    """List approvals, oldest first (pending ones by default)."""
    who = reviewer_of(reviewer, groups, "--reviewer")
    wanted = None if status == "all" else status
    found = run_with_app(
        ctx, lambda app: app.list_approvals(wanted, run_id=run_id, reviewer=who, limit=limit)
    )
    if as_json:
        click.echo(json.dumps([approval_json(a) for a in found], indent=2))
        return
    if not found:
        console().print("no approvals" if wanted is None else f"no {wanted} approvals", style="dim")
        return
    quorum = any(a.required > 1 for a in found)
    table = new_table("id", "title", "status", "run", "reviewers", "expires",
                      *(["approvals"] if quorum else []))  # fmt: skip
    for a in found:
        expires = Text(relative_time(a.expires_at)) if a.status in OPEN else Text("-", "dim")
        votes = [votes_text(a) if a.required > 1 else ""] if quorum else []
        table.add_row(shown(a.id), said(a.title), status_text(a.status), shown(a.run_id),
                      shown(", ".join(a.reviewers)), expires, *map(shown, votes))  # fmt: skip
    console().print(table)


@approvals.command("show")
@click.argument("approval_id", metavar="ID")
@token_option
@no_claimed_reviewer
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
@click.pass_context
def approvals_show(ctx: click.Context, approval_id: str, token: str | None, as_json: bool) -> None:
    """Show one approval: what it asks, the operation and context (secrets redacted), its
    options, its operation digest, its decision, and the commands that decide it.

    With a token (--token, $TETHER_TOKEN or `tether login`), the view is recorded in the audit
    trail as its user's (event `viewed`, once per user) and says whether they may decide."""
    token, source = token_source(ctx, token)

    async def work(app: App) -> tuple[Approval, Reviewer | None]:
        who = None if token is None else (await signed_in(app, token, source)).reviewer
        found = await app.get_approval(approval_id, viewer=who, channel="cli", client=cli_client())
        return found, who

    a, who = run_with_app(ctx, work)
    commands = decide_commands(ctx, a) if a.status == "pending" else []
    if as_json:
        click.echo(json.dumps({**approval_json(a), "commands": commands}, indent=2))
        return
    out = console()
    out.print(said(a.title, "bold"))
    if a.description:
        out.print(said(a.description, lines=True))
    out.print()
    expires = f"{short_time(a.expires_at)} UTC"
    if a.status in OPEN:
        expires += f" ({relative_time(a.expires_at)})"
    rows: list[tuple[str, str | Text]] = [
        ("id", shown(a.id)), ("status", status_text(a.status)),
        ("run", shown(f"{a.run_id} (step {a.step})")), ("reviewers", shown(", ".join(a.reviewers))),
        ("required", Text(votes_text(a) if a.required > 1 else "1 approval")),
    ]  # fmt: skip
    if a.separate_duties:
        rows.append(("separate duties", shown(f"yes: {a.starter or 'nobody'} may not decide")))
    if a.starter:
        rows.append(("started by", shown(a.starter)))
    rows += [("created", f"{short_time(a.created_at)} UTC"), ("expires", expires),
             ("digest", shown(a.operation_digest))]  # fmt: skip
    if who is not None:
        rows.append(("you", shown(who.name)))
        rows.append(("you may decide", "yes" if a.may_decide(who) else "no"))
    out.print(fields_grid(rows))
    for title, value in (("operation", a.operation), ("context", a.context)):
        out.print(Text(f"\n{title}", style="bold"))
        out.print(pretty_json(value))
    out.print()
    options = new_table("id", "label", "style", "response", title="options")
    for o in a.options:
        options.add_row(shown(o.id), said(o.label), shown(o.style),
                        "JSON (see its schema)" if takes_response(o, a) else "none")  # fmt: skip
    out.print(options)
    if a.decision is not None:
        show_decision(a.decision)
    for entry in a.outcomes:
        out.print(Text("outcome ", style="bold") + shown(entry.get("outcome")))
        if entry.get("detail") is not None:
            out.print(pretty_json(entry.get("detail")))
    if commands:
        out.print(Text("\nto decide (as the user of your token: --token, $TETHER_TOKEN or "
                       "`tether login`; --digest binds your decision to the operation above):",
                       style="bold"))  # fmt: skip
        pasteable = console(soft_wrap=True)  # a command is never broken over lines
        for line in commands:
            pasteable.print(shown(f"  {line}"))


def show_decision(decision: Decision) -> None:
    rows: list[tuple[str, str | Text]] = [("status", status_text(decision.status))]
    if decision.option:
        rows.append(("option", shown(decision.option)))
    if decision.reviewer:
        rows.append(("by", shown(decision.reviewer)))
    if len(decision.approvers) > 1:
        rows.append(("approvers", shown(", ".join(decision.approvers))))
    if decision.decided_at is not None:
        rows.append(("at", f"{short_time(decision.decided_at)} UTC"))
    if decision.comment:
        rows.append(("comment", said(decision.comment, lines=True)))
    out = console()
    out.print(Text("\ndecision", style="bold"))
    out.print(fields_grid(rows))
    if decision.response is not None:
        out.print(Text("response", style="bold"))
        out.print(pretty_json(decision.response))


def decide_and_print(
    ctx: click.Context,
    approval_id: str,
    option: str,
    token: str | None,
    digest: str,
    comment: str | None,
    response: Any,
    as_json: bool,
) -> None:
    """Decide as the token's user, never as a name given here: one operator holding one token
    is one reviewer, however many times they run the command."""
    token, source = token_source(ctx, token)
    if token is None:
        raise CliError(UNAUTHENTICATED)

    async def work(app: App) -> tuple[Decision, Approval]:
        user = await signed_in(app, token, source)
        decision = await app.decide(approval_id, option, reviewer=user.reviewer,
                                    operation_digest=digest, comment=comment,
                                    response=response, channel="cli",
                                    client=cli_client())  # fmt: skip
        return decision, await app.get_approval(approval_id)

    try:
        decision, approval = run_with_app(ctx, work)
    except ApprovalRefused as exc:
        raise Refused(f"refused ({exc.reason}): {exc}") from exc
    if as_json:
        click.echo(json.dumps({**decision_json(decision), "required": approval.required},
                              indent=2))  # fmt: skip
        return
    line = shown(f"{approval_id}: ") + status_text(decision.status)
    if decision.status == "pending":
        line += shown(f": {votes_text(approval)}")
    else:
        line += shown(f" by {decision.reviewer}")
        if len(decision.approvers) > 1:
            line += shown(f" (approvers: {', '.join(decision.approvers)})")
    console().print(line)


@approvals.command("approve")
@click.argument("approval_id", metavar="ID")
@decide_options
@click.option(
    "--option",
    default="approve",
    show_default=True,
    metavar="OPTION",
    help="Decide with this option instead, e.g. a custom `edit` (`show` lists the options).",
)
@click.option(
    "--response",
    metavar="JSON",
    callback=json_text,
    help="The option's response as JSON text, checked against its schema, e.g. "
    '\'{"arguments": {"version": "1.2.4"}}\' for an edit.',
)
@click.option("--json", "as_json", is_flag=True, help="Print the decision as a JSON object.")
@click.pass_context
def approvals_approve(
    ctx: click.Context,
    approval_id: str,
    token: str | None,
    digest: str,
    comment: str | None,
    option: str,
    response: Any,
    as_json: bool,
) -> None:
    """Approve the approval ID as the user whose token you hold (or decide it with another
    --option). The token: --token, $TETHER_TOKEN, or the one `tether login` stored.

    --digest is the operation digest that `tether approvals show ID` prints: the decision is
    bound to the operation you saw, and refused if it differs. When several approvals are
    required, each user counts once until enough distinct reviewers approved. A refusal
    (wrong reviewer, stale digest, expired, already decided, ...) prints its reason and exits 1.
    """
    decide_and_print(ctx, approval_id, option, token, digest, comment, response, as_json)


@approvals.command("reject")
@click.argument("approval_id", metavar="ID")
@decide_options
@click.option("--json", "as_json", is_flag=True, help="Print the decision as a JSON object.")
@click.pass_context
def approvals_reject(
    ctx: click.Context,
    approval_id: str,
    token: str | None,
    digest: str,
    comment: str | None,
    as_json: bool,
) -> None:
    """Reject the approval ID as the user whose token you hold: its run sees `rejected`, not
    approved. The token: --token, $TETHER_TOKEN, or the one `tether login` stored.

    --digest is the operation digest that `tether approvals show ID` prints: the decision is
    bound to the operation you saw, and refused if it differs. A refusal prints its reason and
    exits 1.
    """
    decide_and_print(ctx, approval_id, "reject", token, digest, comment, None, as_json)


@approvals.command("cancel")
@click.argument("approval_id", metavar="ID")
@token_option
@no_claimed_reviewer
@click.option(
    "--reason",
    default="cancelled",
    show_default=True,
    metavar="TEXT",
    help="Why it is withdrawn; kept in the audit trail.",
)
@click.pass_context
def approvals_cancel(ctx: click.Context, approval_id: str, token: str | None, reason: str) -> None:
    """Withdraw the pending approval ID as the user whose token you hold (one of its reviewers,
    or group admin): its run sees `cancelled`, never approved."""
    token, source = token_source(ctx, token)
    if token is None:
        raise CliError(UNAUTHENTICATED)

    async def work(app: App) -> Decision:
        user = await signed_in(app, token, source)
        found = await app.get_approval(approval_id)
        if not (user.is_admin or found.may_decide(user.reviewer)):
            raise Refused(
                f"refused (wrong_reviewer): {user.name!r} may not cancel approval "
                f"{approval_id!r}: only its reviewers and group admin may"
            )
        return await app.cancel_approval(approval_id, actor=user.name, reason=reason,
                                         channel="cli", client=cli_client())  # fmt: skip

    try:
        decision = run_with_app(ctx, work)
    except ApprovalRefused as exc:
        raise Refused(f"refused ({exc.reason}): {exc}") from exc
    console().print(shown(f"{approval_id}: ") + status_text(decision.status))


@approvals.command("history")
@click.argument("approval_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.pass_context
def approvals_history(ctx: click.Context, approval_id: str, as_json: bool) -> None:
    """Show the audit trail of approval ID, oldest first: when, what, who, and the detail."""
    entries = run_with_app(ctx, lambda app: app.approval_history(approval_id))
    if as_json:
        click.echo(json.dumps([history_json(e) for e in entries], indent=2))
        return
    table = new_table("#", "at", "event", "actor", "detail")
    for e in entries:
        detail = (
            json.dumps(redact(e.detail), sort_keys=True, ensure_ascii=False) if e.detail else ""
        )
        table.add_row(str(e.seq), short_time(e.at), shown(e.event), shown(e.actor or ""),
                      shown(detail))  # fmt: skip
    console().print(table)


@approvals.command("verify")
@click.argument("approval_id", metavar="[ID]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
@click.pass_context
def approvals_verify(ctx: click.Context, approval_id: str | None, as_json: bool) -> None:
    """Verify every approval (or approval ID) against its hash-chained audit trail.

    Names each approval whose trail was edited, cut short or had entries deleted, whose row
    was rewritten (reviewers, quorum, separation of duties, operation, digest, expiry, status,
    who decided), and each approval a run created that was deleted with its trail; exits 1 if
    any is broken, 0 if all are intact. Approvals made before Tether committed their fixed
    fields to the trail are counted as "not covered" (their chain and status are checked).
    """
    checked = run_with_app(ctx, lambda app: app.check_approvals(approval_id))
    broken = {aid: list(c.problems) for aid, c in checked.items() if c.problems}
    uncovered = sorted(aid for aid, c in checked.items() if not c.covered and not c.problems)
    if as_json:
        rows = [{"id": aid, "problems": problems} for aid, problems in broken.items()]
        report: dict[str, Any] = {"verified": len(checked), "broken": rows}
        if uncovered:  # only approvals made before the commitment: most databases have none
            report["not_covered"] = uncovered
        click.echo(json.dumps(report, indent=2))
    else:
        out = console()
        for aid, problems in broken.items():
            out.print(shown(f"{aid}: ", "bold red") + shown("; ".join(problems)))
        summary = f"{len(checked)} approvals verified, {len(broken)} broken"
        if uncovered:
            summary += (f", {len(uncovered)} not covered (made before their fixed fields were "
                        "committed to the trail)")  # fmt: skip
        out.print(summary, style="red" if broken else "green")
    if broken:
        ctx.exit(1)
