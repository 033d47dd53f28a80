"""`tether login | logout` and where the CLI's token comes from: `--token`, $TETHER_TOKEN, or the
credentials file `tether login` writes (mode 0600, $XDG_CONFIG_HOME/tether/credentials). The
commands that decide resolve the token to its user in the database (tether.users.authenticate).

It must not judge a decision or trust a name it is told: who decides is the token's owner. It
never prints, logs or stores a token anywhere but the credentials file.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import stat
import tempfile
from pathlib import Path

import click
from click.core import ParameterSource

from tether.app import App
from tether.cli.common import (
    CliError,
    F,
    chosen,
    console,
    database_options,
    load_app,
    require_database,
    run_app,
)
from tether.text import visible
from tether.users import User, authenticate

TOKEN_ENV = "TETHER_TOKEN"  # noqa: S105 - the name of a variable, not a secret
UNAUTHENTICATED = (
    "decisions are authenticated: pass --token or set TETHER_TOKEN; see `tether users add` "
    "(and `tether login`, which stores a token)"
)


def credentials_path() -> Path:
    """$XDG_CONFIG_HOME/tether/credentials, or ~/.config/tether/credentials."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "tether" / "credentials"


def stored_token() -> str | None:
    """The token `tether login` stored, or None when there is none. A file that others may read
    (or that another user owns) is refused: a token in it may already be another's."""
    path = credentials_path()
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise CliError(f"{path} is not a regular file; remove it and run `tether login` again")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CliError(f"{path} belongs to another user; remove it and run `tether login` again")
    if info.st_mode & 0o077:
        raise CliError(
            f"{path} may be read by others (mode {stat.S_IMODE(info.st_mode):04o}): its token "
            f"may have leaked; revoke it (`tether users revoke NAME`), remove the file and run "
            f"`tether login` with a new token"
        )
    try:
        token = json.loads(path.read_text(encoding="utf-8"))["token"]
    except (ValueError, KeyError, TypeError):
        raise CliError(f"{path} is not a credentials file; run `tether login` again") from None
    if not isinstance(token, str):
        raise CliError(f"{path} is not a credentials file; run `tether login` again")
    return token


def store_token(token: str, user: User) -> Path:
    """Write the credentials file atomically, created 0600 in a 0700 directory: the token is
    never readable by others, not even for a moment."""
    path = credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)  # the directory is Tether's own: nobody else lists it either
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"token": token, "user": user.name}, out)
            out.write("\n")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def token_option(command: F) -> F:
    return click.option(
        "--token",
        metavar="TOKEN",
        envvar=TOKEN_ENV,
        show_envvar=True,
        help="Act as the user holding this token (`tether users add` prints it). Prefer "
        "$TETHER_TOKEN or `tether login`: a command line is visible to other processes.",
    )(command)


def refuse_as(ctx: click.Context, param: click.Parameter, value: object) -> None:
    """--as and --group named a reviewer anyone could claim to be: they are gone."""
    if value:
        raise click.UsageError(UNAUTHENTICATED, ctx)


def no_claimed_reviewer(command: F) -> F:
    """Hidden --as/--group that fail with the reason, rather than `no such option`."""
    for flag in ("--group", "--as"):
        command = click.option(
            flag,
            f"claimed{flag.replace('-', '_')}",
            multiple=flag == "--group",
            hidden=True,
            expose_value=False,
            callback=refuse_as,
            help="Removed: who decides is the owner of the token (--token).",
        )(command)
    return command


def token_source(ctx: click.Context, token: str | None) -> tuple[str | None, str]:
    """The token to use and where it came from (for messages that never show the token)."""
    if token:
        source = ctx.get_parameter_source("token")
        return token, "$TETHER_TOKEN" if source is ParameterSource.ENVIRONMENT else "--token"
    return stored_token(), str(credentials_path())


async def signed_in(app: App, token: str, source: str) -> User:
    """The active user holding `token`, or a CliError saying what to do."""
    await app.open()
    user = await authenticate(app.engine, token)
    if user is None:
        raise CliError(
            f"the token from {source} is not valid in this database (mistyped, revoked or of "
            f"another database); an admin issues one with `tether users add NAME`, and "
            f"`tether login` stores it"
        )
    return user


def cli_client() -> str:
    """What the audit trail records as the client of a CLI request: host, process, OS user."""
    try:
        login = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        login = str(os.getuid()) if hasattr(os, "getuid") else "?"
    return f"cli {socket.gethostname()} pid {os.getpid()} user {login}"[:200]


@click.command()
@database_options
@token_option
@click.pass_context
def login(ctx: click.Context, database: str, app_ref: str | None, token: str | None) -> None:
    """Check a token against the database and store it for the commands that decide (in
    $XDG_CONFIG_HOME/tether/credentials, mode 0600). Without --token or $TETHER_TOKEN, reads
    the token from the terminal without echoing it."""
    if token:
        source = token_source(ctx, token)[1]
    else:
        token, source = click.prompt("token", hide_input=True, err=True).strip(), "the prompt"
    chose = chosen(ctx, database, app_ref)  # `tether -d URL login` too
    database, app_ref = chose["database"], chose["app"]
    if not app_ref:
        require_database(database, "pass --database URL (or set TETHER_DATABASE_URL)")
    app = load_app(app_ref) if app_ref else App(database)
    user = run_app(app, lambda a: signed_in(a, token, source))
    path = store_token(token, user)
    groups = f" (groups: {', '.join(sorted(user.groups))})" if user.groups else ""
    console(stderr=True).print(visible(f"signed in as {user.name}{groups}; token stored in {path}"))


@click.command()
def logout() -> None:
    """Remove the token `tether login` stored (the token stays valid: revoke it with
    `tether users revoke NAME`)."""
    path = credentials_path()
    try:
        path.unlink()
    except FileNotFoundError:
        console(stderr=True).print(visible(f"not signed in: no {path}"))
        return
    console(stderr=True).print(visible(f"signed out: removed {path}"))
