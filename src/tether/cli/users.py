"""`tether users add|list|revoke`: the people and programs that may use the server and the inbox.

`add` prints the new token once (only its SHA-256 is stored). A thin shell over tether.users;
it must not touch the database except through it.
"""

from __future__ import annotations

import json

import click

from tether.app import App
from tether.cli.common import (
    chosen,
    console,
    database_options,
    load_app,
    new_table,
    run_app,
    short_time,
)
from tether.users import User, add_user, list_users, revoke_user
from tether.views import iso


def _app(ctx: click.Context) -> App:
    ref = ctx.obj["app"]
    return load_app(ref) if ref else App(ctx.obj["database"])


def user_json(user: User) -> dict[str, object]:
    return {"name": user.name, "groups": sorted(user.groups), "created_at": iso(user.created_at),
            "revoked_at": iso(user.revoked_at), "active": user.active}  # fmt: skip


@click.group()
@database_options
@click.pass_context
def users(ctx: click.Context, database: str, app_ref: str | None) -> None:
    """Add, list and revoke the users of `tether serve` (API tokens and inbox sign-in)."""
    ctx.obj = chosen(ctx, database, app_ref)


@users.command("add")
@click.argument("name")
@click.option("--group", "-g", "groups", multiple=True,
              help="A group the user belongs to (repeat for several); group admin may see and "
              "act on every run.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with the token).")
@click.pass_context
def users_add(ctx: click.Context, name: str, groups: tuple[str, ...], as_json: bool) -> None:
    """Add user NAME and print their token, once: it cannot be shown again."""

    async def work(app: App) -> tuple[User, str]:
        await app.open()
        return await add_user(app.engine, name, frozenset(groups))

    user, token = run_app(_app(ctx), work)
    if as_json:
        click.echo(json.dumps({**user_json(user), "token": token}, indent=2))
        return
    where = f" (groups: {', '.join(sorted(user.groups))})" if user.groups else ""
    click.echo(f"user {user.name} added{where}. Token, shown once:", err=True)
    click.echo(token)


@users.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def users_list(ctx: click.Context, as_json: bool) -> None:
    """List users (never their tokens)."""

    async def work(app: App) -> list[User]:
        await app.open()
        return await list_users(app.engine)

    found = run_app(_app(ctx), work)
    if as_json:
        click.echo(json.dumps([user_json(u) for u in found], indent=2))
        return
    table = new_table("name", "groups", "added", "status")
    for user in found:
        status = "active" if user.active else f"revoked {short_time(user.revoked_at)}"
        table.add_row(
            user.name, ", ".join(sorted(user.groups)), short_time(user.created_at), status
        )
    console().print(table)


@users.command("revoke")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def users_revoke(ctx: click.Context, name: str, as_json: bool) -> None:
    """Revoke user NAME: their token and every inbox session end at once."""

    async def work(app: App) -> User:
        await app.open()
        return await revoke_user(app.engine, name)

    user = run_app(_app(ctx), work)
    if as_json:
        click.echo(json.dumps(user_json(user), indent=2))
        return
    click.echo(f"user {user.name} revoked")
