"""Fixtures for the multi-session tests.

One throwaway PostgreSQL cluster for the whole session (pgtools.Cluster, the same as scripts/cluster) on a
port of its own (tests/ports: "multisession"; IDEM_TEST_PORT overrides), one test database with the
extension, stopped at the end.
"""
import os

import psycopg
import pytest

import figures
import pgtools
from edition_marks import pytest_collection_modifyitems, pytest_configure  # noqa: F401 - the native_only mark

PORT = int(os.environ.get("IDEM_TEST_PORT") or pgtools.port("multisession"))
SOCKDIR = os.environ.get("IDEM_TEST_SOCKDIR", f"/tmp/idem-sock-{PORT}")
PGDATA = os.environ.get("IDEM_TEST_PGDATA", f"/tmp/idem-data-{PORT}")
DBNAME = "idem_multisession"

# Extra postgresql.conf lines. None of them changes what the extension promises:
# a short deadlock_timeout only makes the deadlock retries of the races cheap. The library is
# preloaded, as in production, so that every test also runs with the statistics counting
# (test_stats.py checks them); its worker maintains only the database "postgres", which has no
# extension here.
SERVER_CONF = [
    "deadlock_timeout = 100ms",
    "synchronous_commit = off",
    "shared_preload_libraries = 'idempotency'",
]

# Business tables of the tests. No unique constraints on purpose: a duplicate side effect must be
# visible as a second row, never hidden by a constraint violation.
TEST_TABLES = """
CREATE TABLE race_effects (scope text NOT NULL, key text NOT NULL, worker int NOT NULL,
                           token bigint, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE side_effects (scope text NOT NULL, key text NOT NULL, note text);
CREATE TABLE lease_log    (scope text NOT NULL, key text NOT NULL, token bigint NOT NULL,
                           worker int NOT NULL, claimed_at timestamptz NOT NULL,
                           lease_end timestamptz NOT NULL, fate text NOT NULL DEFAULT 'holding');
CREATE TABLE lease_effects (scope text NOT NULL, key text NOT NULL, token bigint NOT NULL,
                            worker int NOT NULL);
"""

class Cluster:
    """Where the test cluster is, and a way to open one session on it."""

    host = SOCKDIR
    port = PORT
    dbname = DBNAME
    pgdata = PGDATA

    def connect(self, dbname=None, statement_timeout_ms=60000, autocommit=True, user="postgres"):
        # Autocommit at the driver level: the tests send BEGIN / COMMIT / ROLLBACK themselves, so
        # every transaction boundary is explicit and a lone statement is its own transaction.
        return _server.connect(dbname=dbname or self.dbname, autocommit=autocommit,
                               statement_timeout_ms=statement_timeout_ms, user=user)


# The server's environment. With RUST_BACKTRACE=1, pgrx appends a Rust backtrace to the DETAIL of an
# error that crossed the extension's frames unless the extension prevents it; tests/multisession/test_errors.py
# checks that no client ever sees one, which it can only catch with the variable set.
SERVER_ENV = pgtools.BACKTRACE_ENV

_server = pgtools.Cluster(PORT, SERVER_CONF, sockdir=SOCKDIR, pgdata=PGDATA, server_env=SERVER_ENV)


@pytest.fixture(scope="session")
def cluster():
    _server.init()
    try:
        _server.start()
        c = Cluster()
        with c.connect(dbname="postgres") as admin:
            admin.execute(f"CREATE DATABASE {DBNAME}")
        with c.connect() as conn:
            try:
                pgtools.install_extension(conn)
                conn.execute("SELECT FROM idem_maintenance()")  # the first partitions
            except psycopg.Error as e:
                pytest.fail(f"CREATE EXTENSION idempotency failed ({e.sqlstate}): {e}. "
                            "Is the extension built and installed (scripts/build)?")
            except RuntimeError as e:  # the SQL edition's install (IDEM_EDITION=sql)
                pytest.fail(str(e))
            conn.execute(TEST_TABLES)
        yield c
    finally:
        _server.stop()


report, pytest_terminal_summary = figures.plugin("idempotency multi-session figures")
