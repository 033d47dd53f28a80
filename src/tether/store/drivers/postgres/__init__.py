"""The PostgreSQL driver: the pool, reads and LISTEN/NOTIFY (driver), the group commit
(commit), statements on a connection (statements), the URL's options (options), a transaction
step's guarded connection (body) and upkeep (maintenance).
"""

from tether.store.drivers.postgres.driver import PostgresDriver
from tether.store.drivers.postgres.options import (
    PostgresOptions,
    parse_postgres_url,
    postgres_options,
)
from tether.store.drivers.postgres.statements import CHANNEL

__all__ = ["CHANNEL", "PostgresDriver", "PostgresOptions", "parse_postgres_url", "postgres_options"]
