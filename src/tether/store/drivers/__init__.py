"""The SQL drivers: what differs between SQLite and PostgreSQL below the operations, written
once each: connections, executing a named query, the group commit, waking idle workers, and
maintenance. They run operations (tether.store.ops) and know nothing of runs.
"""
