"""The options of a PostgreSQL database URL that are Tether's own, taken off the URL before it
reaches libpq: `schema` (Tether's tables in that schema), `pool_min` and `pool_max` (the pool's
size), `prepare_threshold` (executions of a statement on a connection before it is prepared;
`none` turns prepared statements off, as PgBouncer in transaction mode needs), `migrate`
(`false`: check the schema at open, never change it; for a role without DDL rights).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from tether.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    conninfo: str  # the URL without Tether's own options
    schema: str | None = None
    pool_min: int = 1
    pool_max: int = 10
    prepare_threshold: int | None = 5
    migrate: bool = True


def _int(query: dict[str, list[str]], name: str, default: int, url: str) -> int:
    value = query.pop(name, [str(default)])[0]
    if not value.isdigit() or int(value) < (1 if name != "prepare_threshold" else 0):
        raise ConfigurationError(f"{name}={value!r} in the database URL {url!r}: use a count")
    return int(value)


def parse_postgres_url(url: str) -> tuple[str, str | None]:
    """(the connection URL without Tether's own options, the schema or None)."""
    options = postgres_options(url)
    return options.conninfo, options.schema


def postgres_options(url: str) -> PostgresOptions:
    """The connection URL without Tether's own options, and those options."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    schema = query.pop("schema", [None])[0]
    if schema is not None and not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        raise ConfigurationError(
            f"schema={schema!r} in the database URL: use lower-case letters, digits and _"
        )
    pool_min = _int(query, "pool_min", 1, url)
    pool_max = _int(query, "pool_max", max(10, pool_min), url)
    if pool_max < pool_min:
        raise ConfigurationError(f"pool_max is below pool_min in the database URL {url!r}")
    threshold: int | None
    if query.get("prepare_threshold", [""])[0].lower() == "none":
        query.pop("prepare_threshold")
        threshold = None
    else:
        threshold = _int(query, "prepare_threshold", 5, url)
    migrate = query.pop("migrate", ["true"])[0].lower()
    if migrate not in ("true", "false"):
        raise ConfigurationError(
            f"migrate={migrate!r} in the database URL {url!r}: use migrate=true or false"
        )
    rest = urlencode({k: v[0] for k, v in query.items()})
    scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
    conninfo = urlunsplit((scheme, parts.netloc, parts.path, rest, ""))
    return PostgresOptions(conninfo, schema, pool_min, pool_max, threshold, migrate == "true")
