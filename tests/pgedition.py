"""Which edition the tests install (IDEM_EDITION: `native`, the default, or `sql`, the SQL edition of
sql/edition/), and how. Part of tests/pgtools.py, which re-exports it; psycopg only when a connection is
used.
"""
import atexit
import functools
import os
import pathlib
import shutil
import subprocess
import tempfile

from pgpaths import EXT, pg

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The edition under test: IDEM_EDITION=native (the default: CREATE EXTENSION idempotency) or sql (the SQL
# edition: the plain script of scripts/sql-edition, run with psql by a non-superuser database owner)
EDITIONS = ("native", "sql")
# The owner role that installs the SQL edition when the caller names none: a non-superuser with CREATEROLE
# (what the managed services' admin roles are), made the database's owner.
EDITION_OWNER = "idem_owner"


def edition():
    """The edition the tests install: IDEM_EDITION, `native` when unset or empty."""
    e = os.environ.get("IDEM_EDITION") or "native"
    if e not in EDITIONS:
        raise RuntimeError(f"IDEM_EDITION={e!r}: one of {', '.join(EDITIONS)}")
    return e


def sql_edition():
    return edition() == "sql"


def native_only(reason):
    """A pytest mark: the test covers what only the native extension has (`reason`), so it is skipped
    under IDEM_EDITION=sql. The same as @pytest.mark.native_only(reason), which the conftests register."""
    import pytest

    return pytest.mark.native_only(reason)


@functools.lru_cache(maxsize=None)
def sql_edition_script():
    """The SQL edition's plain install script, made once per run: IDEM_SQL_EDITION_SCRIPT when it names
    an existing file (a caller made it already), else scripts/sql-edition into a new temporary directory,
    whose path is then put into IDEM_SQL_EDITION_SCRIPT for this process's children."""
    given = os.environ.get("IDEM_SQL_EDITION_SCRIPT")
    if given and os.path.isfile(given):
        return pathlib.Path(given)
    out = pathlib.Path(tempfile.mkdtemp(prefix="idem-sql-edition-"))
    atexit.register(shutil.rmtree, out, True)  # this process's children, which it hands the path on to, end first
    r = subprocess.run([str(ROOT / "scripts" / "sql-edition"), str(out)], capture_output=True, text=True)
    script = out / "idempotency.sql"
    if r.returncode != 0 or not script.is_file():
        raise RuntimeError(f"scripts/sql-edition {out} failed (exit {r.returncode}): {r.stdout}{r.stderr}")
    out.chmod(0o755)
    script.chmod(0o644)
    os.environ["IDEM_SQL_EDITION_SCRIPT"] = str(script)
    return script


def edition_conf(lines):
    """postgresql.conf lines for the edition under test: under the SQL edition, idempotency taken out of
    shared_preload_libraries (the edition runs on servers without the library; a test that needs it is
    native_only), the rest as they are. Native: the lines unchanged."""
    if not sql_edition():
        return list(lines)
    out = []
    for line in lines:
        key, eq, value = line.partition("=")
        if eq and key.strip() == "shared_preload_libraries":
            libs = [x.strip() for x in value.strip().strip("'").split(",")]
            libs = [x for x in libs if x and x != EXT]
            line = f"shared_preload_libraries = '{','.join(libs)}'"
        out.append(line)
    return out


def _role_exists(conn, role):
    return conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (role,)).fetchone() is not None


def install_extension(conn, owner=None):
    """What the tests run in place of CREATE EXTENSION idempotency, on `conn` (a superuser's session in
    the database to install into, with autocommit).

    native: exactly `CREATE EXTENSION idempotency` on conn.
    sql:    the SQL edition's plain script (sql_edition_script()), run with `psql -X -v ON_ERROR_STOP=1 -f`
            as the database's owner, a non-superuser with CREATEROLE: `owner` when the caller names one (it
            must own the database already: e.g. a test's own hostile owner, which is given CREATEROLE),
            else EDITION_OWNER (idem_owner LOGIN CREATEROLE, made when missing), made the database's owner.
            The functions land in the owner's first search_path schema (public), the storage in schema
            idempotency. Raises RuntimeError with psql's output when the script fails."""
    if not sql_edition():
        conn.execute("CREATE EXTENSION idempotency")
        return
    import psycopg.sql

    db = conn.info.dbname
    if owner is None:
        owner = EDITION_OWNER
        if not _role_exists(conn, owner):
            conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(psycopg.sql.Identifier(owner)))
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} OWNER TO {}").format(psycopg.sql.Identifier(db),
                                                                             psycopg.sql.Identifier(owner)))
    else:
        dbowner = conn.execute("SELECT pg_catalog.pg_get_userbyid(datdba) FROM pg_catalog.pg_database "
                               "WHERE datname = pg_catalog.current_database()").fetchone()[0]
        if dbowner != owner:
            raise RuntimeError(f"install_extension(owner={owner!r}): database {db} is owned by {dbowner}")
        conn.execute(psycopg.sql.SQL("ALTER ROLE {} CREATEROLE").format(psycopg.sql.Identifier(owner)))
    script = sql_edition_script()
    host = conn.info.host
    cmd = [str(pg().bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", str(conn.info.port),
           "-U", owner, "-d", db, "-f", str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PGCONNECT_TIMEOUT": "30"})
    if r.returncode != 0:
        raise RuntimeError(f"the SQL edition's install script failed in database {db} as {owner} "
                           f"(psql exit {r.returncode}): {r.stderr.strip()}")
