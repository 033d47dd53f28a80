"""What every command of the `tether` command line shares: the database options, loading an
App from `module:attribute`, running library calls on an event loop, errors without tracebacks,
and the rendering helpers (tables, statuses, times, a console that prints user text literally
and shows terminal escapes, control, bidi and zero-width characters visibly, never raw).

It must not know any one command, hold engine logic, talk SQL or import a backend.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from tether.app import App
from tether.errors import ConfigurationError, TetherError
from tether.store import database_exists, default_url
from tether.telemetry.logs import LogFormat, log_format_from_env
from tether.text import visible

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
APP_FORM = "module:attribute, e.g. `myproject.main:app`"
LOG_FORMAT_ENV = "TETHER_LOG_FORMAT"
STATUS_STYLE = {  # the statuses of runs, checkpoints and approvals
    "pending": "yellow", "running": "blue", "waiting": "cyan", "held": "bold yellow",
    "succeeded": "green", "failed": "red", "cancelled": "magenta", "dead": "bold red",
    "started": "yellow", "retrying": "cyan",
    "completed": "green", "approved": "green", "rejected": "red", "expired": "magenta",
}  # fmt: skip


class CliError(click.ClickException):
    """A TetherError shown as one red `error: ...` line on stderr (exit code 1)."""

    prefix = "error: "

    def show(self, file: Any = None) -> None:
        # Messages quote ids, names and errors that users and workflows wrote.
        console(stderr=True, soft_wrap=True).print(shown(f"{self.prefix}{self.message}", "red"))


# The extra that installs each optional package a command may import (pyproject.toml).
EXTRAS = {"uvicorn": "server", "fastapi": "server", "starlette": "server", "jinja2": "server",
          "prometheus_client": "server", "psycopg": "postgres", "psycopg_pool": "postgres",
          "opentelemetry": "otel", "langgraph": "langgraph", "openai": "openai",
          "anthropic": "anthropic", "agents": "openai-agents", "authlib": "oidc"}  # fmt: skip


class TetherGroup(click.Group):
    """The root group: turns library errors into CliError, so users see no traceback, and a
    missing optional package into the extra to install. It takes the database options too,
    for the groups' commands, and hands them to every subcommand of those groups."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_database_pair(_remember_top, "a command group's"))

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(cmd, name)
        if isinstance(cmd, click.Group) and any(p.name == "database" for p in cmd.params):
            accept_database_options_after(cmd)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TetherError as exc:
            raise CliError(str(exc)) from exc
        except ModuleNotFoundError as exc:
            extra = EXTRAS.get((exc.name or "").partition(".")[0])
            if extra is None:
                raise
            command = " ".join(filter(None, ["tether", ctx.invoked_subcommand]))
            raise CliError(
                f"`{command}` needs the {extra!r} extra ({exc.name} is not installed): "
                f"pip install 'tether[{extra}]'"
            ) from None


class SafeConsole(Console):
    """A rich Console that passes every piece of text it writes through tether.text.visible:
    whatever a renderable holds, an escape sequence, a C0/C1 control, a bidi override or a
    zero-width character reaches the terminal as visible text (`<U+001B>`, `<U+202E>`). Rich's own
    control segments and the styles it renders are not text, so colours still work. This is
    the net under `shown()`, which escapes at the source so that widths are measured right."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(lines_visible(segment.text), segment.style)
            for segment in buffer
        )


def console(*, stderr: bool = False, soft_wrap: bool = False) -> Console:
    """A console that prints strings literally: titles, comments and error messages come from
    users and workflows, so `[red]` or `:smile:` in them is text, never markup or an emoji,
    and a terminal escape in them is shown, never obeyed (SafeConsole)."""
    return SafeConsole(
        stderr=stderr,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=soft_wrap,
        width=piped_width(sys.stderr if stderr else sys.stdout),
    )


# Output to a pipe or a file is read by grep, less or a log, not an 80-column terminal: rows
# are kept whole up to this width (rich would wrap a table's titles one word per line).
PIPED_WIDTH = 240


def piped_width(stream: Any) -> int | None:
    """The width to render for `stream`: the terminal's (None: rich finds it), $COLUMNS when
    set, else PIPED_WIDTH when the output is not a terminal."""
    if os.environ.get("COLUMNS", "").strip():
        return None
    isatty = getattr(stream, "isatty", None)
    return None if isatty is not None and isatty() else PIPED_WIDTH


def lines_visible(text: str) -> str:
    """visible() keeping newlines (and tabs) but not a carriage return: on a terminal it would
    move back over what was written and hide it."""
    return visible(text, newlines=True).replace("\r", "\\r")


def shown(value: object, style: str = "", *, lines: bool = False) -> Text:
    """`value` as text to print: control, bidi and zero-width characters made visible, never
    read as markup. A newline is shown as `\\n` too (one value, one line) unless `lines`."""
    text = str(value)
    return Text(lines_visible(text) if lines else visible(text, newlines=False), style=style)


def load_app(ref: str) -> App:
    """The App named by `module:attribute`, imported with the current directory on sys.path."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ConfigurationError(f"cannot load {ref!r}: expected {APP_FORM}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise  # the module exists but one of its own imports failed: show that
        raise ConfigurationError(
            f"cannot load {ref!r}: no module named {exc.name!r} (looked in {os.getcwd()} and "
            f"sys.path); expected {APP_FORM}"
        ) from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigurationError(
                f"cannot load {ref!r}: module {module_name!r} has no attribute {attr!r}; "
                f"expected {APP_FORM}"
            )
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise ConfigurationError(
            f"cannot load {ref!r}: it is {type(obj).__name__}, not a tether.App; "
            f"expected {APP_FORM}"
        )
    return obj


def _log_format(ctx: click.Context, param: click.Parameter, value: str | None) -> LogFormat:
    try:  # the option, else $TETHER_LOG_FORMAT, else text
        return log_format_from_env(value if value is not None else os.environ.get(LOG_FORMAT_ENV))
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def log_format_option(command: F) -> F:
    """--log-format text|json of a long-running command (`tether worker`, `tether serve`)."""
    return click.option(
        "--log-format", type=click.Choice(["text", "json"], case_sensitive=False),
        callback=_log_format, help=f"How records are written to stderr: text (default) or "
        f"json, one object a line (${LOG_FORMAT_ENV}).",
    )(command)  # fmt: skip


def require_database(url: str, hint: str) -> None:
    """Refuse a database that does not exist yet: opening it would create an empty one."""
    if not database_exists(url):
        raise ConfigurationError(f"no database at {url!r}; {hint}")


def database_options(group: F) -> F:
    """The options choosing the database of a group's commands: --database URL or --app."""
    group = click.option(
        "--app",
        "app_ref",
        metavar="MODULE:APP",
        help="Use this App's database and workflows (values decode with their type "
        "hints); overrides --database.",
    )(group)
    return click.option(
        "--database",
        "-d",
        metavar="URL",
        envvar="TETHER_DATABASE_URL",
        default=default_url,
        show_default="$TETHER_DATABASE_URL or sqlite:///tether.db",
        help="Database URL of the runs, e.g. sqlite:///path/to/tether.db.",
    )(group)


# -- the database options, accepted before a group, after it and after its subcommand ----------

_TOP = "tether.database-options"  # in ctx.meta (shared by every context): given at the top


def _remember_top(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None and param.name is not None:
        ctx.meta.setdefault(_TOP, {})[param.name] = value


def _override(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None and isinstance(ctx.obj, dict) and param.name is not None:
        ctx.obj[param.name] = value
        ctx.obj["given"] = ctx.obj["given"] or param.name == "database"


def _database_pair(callback: Any, about: str) -> list[click.Parameter]:
    """-d/--database and --app that say what `about`'s own options say (see chosen)."""
    return [
        click.Option(["--database", "-d", "database"], metavar="URL", expose_value=False,
                     callback=callback, help=f"As {about} --database."),
        click.Option(["--app", "app"], metavar="MODULE:APP", expose_value=False,
                     callback=callback, help=f"As {about} --app."),
    ]  # fmt: skip


def chosen(ctx: click.Context, database: str, app_ref: str | None) -> dict[str, Any]:
    """The database options in force for a group's commands (its ctx.obj): its own when given,
    else those given before it (`tether -d URL runs list`), else $TETHER_DATABASE_URL or the
    default; `given`: a database was named on the command line. A subcommand's own options
    override them once it is parsed (`tether runs list -d URL`)."""
    top = ctx.meta.get(_TOP, {})
    given = ctx.get_parameter_source("database") is ParameterSource.COMMANDLINE
    if not given and "database" in top:
        database, given = top["database"], True
    return {"database": database, "app": app_ref or top.get("app"), "given": given}


def accept_database_options_after(group: click.Group) -> None:
    """Let every subcommand of a group with the database options take them too, unless it has
    options of those names of its own."""
    for command in group.commands.values():
        taken = {opt for p in command.params for opt in getattr(p, "opts", ())}
        if not taken & {"-d", "--database", "--app"}:
            command.params.extend(_database_pair(_override, "the group's"))


def run_with_app(ctx: click.Context, work: Callable[[App], Awaitable[T]]) -> T:
    """Open the App chosen by the database options of the command's group, run `work` with it,
    and close it."""
    app_ref: str | None = ctx.obj["app"]
    if not app_ref:
        require_database(
            ctx.obj["database"],
            "pass --database URL (or set TETHER_DATABASE_URL), or --app module:app",
        )
    return run_app(load_app(app_ref) if app_ref else App(ctx.obj["database"]), work)


def run_app(app: App, work: Callable[[App], Awaitable[T]]) -> T:
    """Run `work` with `app` on a new event loop, and close the App afterwards."""

    async def main() -> T:
        try:
            return await work(app)
        finally:
            await app.close()

    return asyncio.run(main())


# -- rendering ------------------------------------------------------------------------------


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def short_time(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def relative_time(moment: datetime, now: datetime | None = None) -> str:
    """`in 2h 5m` or `3m ago`: the two largest units of the distance from now."""
    seconds = int((moment - (now or datetime.now(UTC))).total_seconds())
    parts: list[str] = []
    rest = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size or (unit == "s" and not parts):
            parts.append(f"{rest // size}{unit}")
            rest %= size
        if len(parts) == 2:
            break
    text = " ".join(parts)
    return f"in {text}" if seconds >= 0 else f"{text} ago"


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def new_table(*columns: str, title: str | None = None) -> Table:
    """A borderless table; numbers align right, ids and statuses never wrap (times may)."""
    table = Table(box=None, header_style="bold", title=title, title_justify="left")
    for name in columns:
        number = name in ("#", "attempt", "attempts", "ms", "position")
        keep = name in ("id", "run id", "name", "status")
        table.add_column(name, justify="right" if number else "left", overflow="fold",
                         min_width=len(name), no_wrap=keep)  # fmt: skip
    return table


def fields_grid(rows: list[tuple[str, str | Text]]) -> Table:
    """Name/value pairs, one a line, names in bold."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for name, value in rows:
        grid.add_row(name, value)
    return grid
