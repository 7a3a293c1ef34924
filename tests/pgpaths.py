"""Where PostgreSQL is: the directories its pg_config reports (PG_CONFIG overrides; else the `pg_config`
on PATH; else Debian's /usr/lib/postgresql/15/bin/pg_config). Part of tests/pgtools.py, which re-exports
it; the standard library only.
"""
import functools
import os
import pathlib
import shutil
import subprocess
from dataclasses import dataclass

EXT = "idempotency"
FALLBACK_PG_CONFIG = "/usr/lib/postgresql/15/bin/pg_config"


# ---------------------------------------------------------------------------------------------------
# Where PostgreSQL is


@dataclass(frozen=True)
class PgPaths:
    pg_config: pathlib.Path  # the real pg_config of bindir (not a wrapper such as Debian's /usr/bin/pg_config)
    bindir: pathlib.Path  # postgres, initdb, pg_ctl, psql, pg_dump, pgbench, ...
    pkglibdir: pathlib.Path  # the extension's library (idempotency.so)
    sharedir: pathlib.Path  # extension/ holds the control file and the SQL scripts
    pgxs: pathlib.Path  # .../lib/pgxs: src/test/regress/pg_regress, src/test/isolation/pg_isolation_regress
    version: str  # "PostgreSQL 15.20 (Debian ...)"

    @property
    def extdir(self):
        return self.sharedir / "extension"


def find_pg_config():
    """PG_CONFIG, else pg_config on PATH, else Debian's PostgreSQL 15 one."""
    return os.environ.get("PG_CONFIG") or shutil.which("pg_config") or FALLBACK_PG_CONFIG


@functools.lru_cache(maxsize=None)
def pg():
    """The installation's directories, as its pg_config reports them (asked once per process)."""
    found = find_pg_config()
    try:
        out = subprocess.run([found, "--bindir", "--pkglibdir", "--sharedir", "--pgxs", "--version"],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"cannot run {found} ({e}): is PostgreSQL 15 installed (scripts/install-deps)? "
                           "PG_CONFIG names another pg_config") from e
    bindir, pkglibdir, sharedir, pgxs_mk, version = out[:5]
    bindir = pathlib.Path(bindir)
    real = bindir / "pg_config"
    # ".../lib/pgxs/src/makefiles/pgxs.mk" -> ".../lib/pgxs"
    return PgPaths(pg_config=real if real.exists() else pathlib.Path(found), bindir=bindir,
                   pkglibdir=pathlib.Path(pkglibdir), sharedir=pathlib.Path(sharedir),
                   pgxs=pathlib.Path(pgxs_mk).parents[2], version=version)
