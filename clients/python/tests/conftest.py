"""A throwaway PostgreSQL 15 cluster with the extension, on this package's ports (tests/ports:
client-python), started once per test session and stopped at its end, also on failure."""
import os
import pathlib
import sys
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
import pgtools  # noqa: E402

DB = "client_py"


@pytest.fixture(scope="session")
def cluster():
    port = int(os.environ.get("IDEM_CLIENT_PY_PORT") or pgtools.port("client-python", 0))
    c = pgtools.Cluster(port, ["idempotency.max_attempts = 3", "deadlock_timeout = '100ms'"], max_connections=60)
    c.init()
    try:
        c.start()
        for attempt in range(30):  # the lead may be reinstalling the extension right now
            try:
                c.create_db(DB)
                break
            except Exception:
                if attempt == 29:
                    raise
                import time

                time.sleep(2)
        yield c
    finally:
        c.stop()


@pytest.fixture
def connect(cluster):
    """connect(autocommit=True) -> a new connection to the test database; all closed after the test."""
    conns = []

    def _connect(autocommit=True, **kw):
        c = cluster.connect(DB, autocommit=autocommit, **kw)
        conns.append(c)
        return c

    yield _connect
    for c in conns:
        c.close()


async def aconnect(cluster, autocommit=True):
    """A new psycopg.AsyncConnection to the test database (the async tests close theirs; they run each test
    body with asyncio.run, no pytest plugin needed)."""
    import psycopg

    return await psycopg.AsyncConnection.connect(host=cluster.sockdir, port=cluster.port, user="postgres",
                                                 dbname=DB, autocommit=autocommit)


@pytest.fixture
def scope():
    """A scope of its own per test: keys never collide between tests."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def table(connect):
    """A fresh table (id serial, k text, v jsonb) for the test's business writes; returns its name."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    connect().execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, k text, v jsonb)")
    return name


def status(conn, key, scope):
    """idem_status as a dict, or None."""
    cur = conn.execute("SELECT status, attempts, token, payload, error FROM idem_status(%s, scope => %s)", (key, scope))
    row = cur.fetchone()
    return None if row is None else dict(zip(("status", "attempts", "token", "payload", "error"), row))


def count(conn, table):
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def _http_server(cluster, tmp_path_factory, index, framework):
    from http_server import TABLES, Server

    with cluster.connect(DB) as c:
        c.execute(TABLES)
    s = Server(cluster, DB, pgtools.port("clients-http", index), tmp_path_factory.mktemp(f"http{index}"), framework)
    s.start()
    return s


@pytest.fixture(scope="session")
def server(cluster, tmp_path_factory):
    """The HTTP tests' server (http_server.Server: uvicorn, FastAPI, http_app.py) on the first port of tests/ports
    "clients-http", started once; the tests kill and restart it."""
    s = _http_server(cluster, tmp_path_factory, 0, "fastapi")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def other(cluster, tmp_path_factory):
    """A second instance of the same API, as plain Starlette, on the second port: where a retry goes while
    the first is down, and the one that takes a key over from a frozen first."""
    s = _http_server(cluster, tmp_path_factory, 1, "starlette")
    yield s
    s.stop()


@pytest.fixture
def db(connect):
    """An autocommit connection to the test database."""
    return connect()
