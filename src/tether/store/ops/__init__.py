"""Every Store operation, written once: generators of named queries (tether.store.query) that
the SQL drivers execute, SQLite and PostgreSQL alike, grouped by concept.

An operation encodes its arguments, yields the statements of one transaction and builds the
records from the rows it is sent. It must not touch a connection, a driver or tether.core.
"""
