"""`tether migrate`: bring a database's schema up to this Tether's and exit, for deploys whose
runtime role may not change the schema (its processes open with `?migrate=false`).

Parsing and opening only: opening a store applies its migrations (the drivers'); this command
must not run SQL itself, nor print a database password.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, urlsplit

import click

from tether.redact import redact_text
from tether.store import default_url, store_from_url
from tether.text import visible


async def migrate_store(url: str) -> None:
    store = store_from_url(url)
    try:
        await store.open()  # applies what is missing, or refuses a schema newer than the code
    finally:
        await store.close()


@click.command()
@click.option("--database", "-d", metavar="URL", envvar="TETHER_DATABASE_URL",
              default=default_url, show_default="$TETHER_DATABASE_URL or sqlite:///tether.db",
              help="Database URL to migrate, e.g. postgresql://owner@db/tether.")  # fmt: skip
def migrate(database: str) -> None:
    """Apply the schema migrations this Tether needs to the database, then exit. Run it with a
    role that may change the schema, before starting processes whose URL says
    `migrate=false`; a schema newer than this Tether is refused (upgrade Tether instead)."""
    said = parse_qs(urlsplit(database).query).get("migrate", ["true"])[0].lower()
    if said == "false":
        raise click.UsageError(
            "the URL says migrate=false, which forbids what this command does: drop it "
            "(that option is for the processes that must not change the schema)"
        )
    shown = visible(redact_text(database), newlines=False)
    asyncio.run(migrate_store(database))
    click.echo(f"tether migrate: the schema of {shown} is current")
