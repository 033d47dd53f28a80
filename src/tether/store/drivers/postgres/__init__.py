"""The PostgreSQL driver: the pool, the group commit and LISTEN/NOTIFY (driver), the URL's
options (options), a transaction step's guarded connection (body) and upkeep (maintenance).
"""

from tether.store.drivers.postgres.driver import CHANNEL, PostgresDriver
from tether.store.drivers.postgres.options import (
    PostgresOptions,
    parse_postgres_url,
    postgres_options,
)

__all__ = ["CHANNEL", "PostgresDriver", "PostgresOptions", "parse_postgres_url", "postgres_options"]
