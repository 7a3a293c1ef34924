"""What the project's Python tests, benchmarks and scripts share about PostgreSQL itself.

* where PostgreSQL is: `pg()`, the directories `pg_config` reports (PG_CONFIG overrides; else the
  `pg_config` on PATH; else Debian's /usr/lib/postgresql/15/bin/pg_config);
* which ports are whose: `ports(name)` and `port(name, i)`, read from tests/ports (the one list);
* throwaway clusters: `Cluster`, run as the postgres OS user (initdb and pg_ctl refuse root) on a private
  port and socket directory, with extra postgresql.conf lines and an environment for the server;
* private copies of the installation: `PrivateTree`, a tree under /tmp with copies of the server
  executables, symlinks to the rest of the installation and the extension files of our choice;
* `RETRY_SQLSTATES`, the errors a client answers by running the whole transaction again;
* which edition the tests install (IDEM_EDITION: `native`, the default, or `sql`, the SQL edition of
  sql/edition/): `edition()`, `install_extension(conn)` in place of CREATE EXTENSION idempotency, and
  `native_only(reason)` for what only the native extension has.

The module needs nothing beyond the standard library until a connection is opened (psycopg), so
scripts/cluster runs it with the system's python3:

    python3 tests/pgtools.py cluster start [postgresql.conf lines...]   # IDEM_PORT, IDEM_SOCKDIR, IDEM_PGDATA
    python3 tests/pgtools.py cluster stop
    python3 tests/pgtools.py paths                                       # what pg() found
    python3 tests/pgtools.py install-extension HOST PORT DBNAME          # install_extension() there
"""
import atexit
import functools
import hashlib
import os
import pathlib
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXT = "idempotency"

# What a client retries: the whole transaction, from BEGIN (serialization_failure, deadlock_detected).
RETRY_SQLSTATES = ("40001", "40P01")

# The environment of test servers whose errors are checked for Rust internals: with RUST_BACKTRACE=1 pgrx
# appends a Rust backtrace to the DETAIL of an error that crossed the extension's frames, unless the
# extension prevents it, so a check for one can only fail with the variable set.
BACKTRACE_ENV = {"RUST_BACKTRACE": "1"}

# Crash signatures in a server log: a backend or worker that died of a signal, an assertion, a PANIC.
CRASH_PATTERNS = ("PANIC:", "TRAP:", "terminated by signal", "was terminated by", "server process (PID",
                  "terminating any other active server processes", "all server processes terminated")

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


# ---------------------------------------------------------------------------------------------------
# Ports

PORTS_FILE = ROOT / "tests" / "ports"


@functools.lru_cache(maxsize=None)
def _port_table():
    table = {}
    for line in PORTS_FILE.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 3:
            table[fields[0]] = range(int(fields[1]), int(fields[2]) + 1)
    return table


def ports(name):
    """The port range of one user of ports in tests/ports, e.g. ports("torture") == range(54350, 54360)."""
    try:
        return _port_table()[name]
    except KeyError:
        raise KeyError(f"no port range named {name!r} in {PORTS_FILE}") from None


def port(name, i=0):
    """The i-th port of a range of tests/ports."""
    r = ports(name)
    if not 0 <= i < len(r):
        raise IndexError(f"port {i} of {name!r}: the range {r.start}-{r.stop - 1} has {len(r)} ports")
    return r[i]


# ---------------------------------------------------------------------------------------------------
# Processes


def as_postgres(args, **kw):
    """subprocess.run of a command as the postgres OS user (through sudo, unless we are postgres)."""
    args = [str(a) for a in args]
    if pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        # sudo drops LD_LIBRARY_PATH; a PostgreSQL of another major than Debian's needs its own libpq
        # (scripts/test sets it for those), so it is handed on explicitly.
        keep = [f"LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}"] if os.environ.get("LD_LIBRARY_PATH") else []
        args = ["sudo", "-u", "postgres", "-H", *(["env", *keep] if keep else []), *args]
    return subprocess.run(args, **kw)


def caller_server_env():
    """The caller's RUST_BACKTRACE, if it has one: sudo resets the environment, so it is handed on explicitly."""
    v = os.environ.get("RUST_BACKTRACE")
    return {} if v is None else {"RUST_BACKTRACE": v}


def process_environ(pid):
    """The environment of a running process, from /proc (OSError when it cannot be read)."""
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def crash_lines(text):
    return [line for line in text.splitlines() if any(p in line for p in CRASH_PATTERNS)]


# ---------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------
# Throwaway clusters


class Cluster:
    """A throwaway cluster owned by the postgres OS user, on a private port and socket directory.

    init() wipes the data directory (stopping a server left running there) and runs initdb, then appends
    to postgresql.conf: port, listen_addresses, unix_socket_directories, max_connections and fsync (from
    the arguments), then the `conf` lines (later lines win). Every pg_ctl call runs with `server_env` in
    its environment, so the server has it; None means the caller's RUST_BACKTRACE when it has one.
    """

    def __init__(self, port, conf=(), *, bindir=None, sockdir=None, pgdata=None, logfile=None,
                 listen="127.0.0.1", max_connections=200, fsync="on", server_env=None):
        self.port = int(port)
        self.bindir = pathlib.Path(bindir) if bindir is not None else pg().bindir
        self.sockdir = str(sockdir if sockdir is not None else f"/tmp/idem-sock-{self.port}")
        self.pgdata = str(pgdata if pgdata is not None else f"/tmp/idem-data-{self.port}")
        self.logfile = pathlib.Path(logfile if logfile is not None else pathlib.Path(self.pgdata, "server.log"))
        self.conf = list(conf)
        self.listen = listen
        self.max_connections = max_connections
        self.fsync = fsync
        self.server_env = caller_server_env() if server_env is None else dict(server_env)

    # ---- the server

    def base_conf(self):
        return [f"port = {self.port}", f"listen_addresses = '{self.listen}'",
                f"unix_socket_directories = '{self.sockdir}'", f"max_connections = {self.max_connections}",
                f"fsync = {self.fsync}"]

    def pg_ctl(self, *args, check=True):
        env = [f"{k}={v}" for k, v in self.server_env.items()]
        r = as_postgres(["env", *env, self.bindir / "pg_ctl", "-D", self.pgdata, *args], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(map(str, args))} failed: {r.stdout} {r.stderr}\n{self.log_tail()}")
        return r

    def running(self):
        return os.path.exists(os.path.join(self.pgdata, "postmaster.pid"))

    def init(self, stop_mode="fast"):
        """A new, empty data directory (a server still running in the old one is stopped with stop_mode)."""
        if os.path.isdir(self.pgdata):
            self.pg_ctl("stop", "-m", stop_mode, "-w", check=False)
        subprocess.run(["rm", "-rf", self.pgdata, self.sockdir], check=True)
        subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", self.sockdir], check=True)
        as_postgres([self.bindir / "initdb", "-D", self.pgdata, "-A", "trust", "-U", "postgres", "--no-sync"],
                    check=True, stdout=subprocess.DEVNULL)
        self.append_conf(edition_conf([*self.base_conf(), *self.conf]))

    def append_conf(self, lines):
        as_postgres(["tee", "-a", os.path.join(self.pgdata, "postgresql.conf")], input="\n".join(lines) + "\n",
                    text=True, check=True, stdout=subprocess.DEVNULL)

    def start(self, timeout=None):
        """pg_ctl start, waiting until the server accepts connections (pg_ctl's own 60 s unless timeout)."""
        self.pg_ctl("start", "-l", str(self.logfile), "-w", *(("-t", str(timeout)) if timeout else ()))

    def stop(self, mode="fast", timeout=None):
        """pg_ctl stop when a data directory exists; a server that is not running is no error."""
        if os.path.isdir(self.pgdata):
            self.pg_ctl("stop", "-m", mode, "-w", *(("-t", str(timeout)) if timeout else ()), check=False)

    def postmaster_pid(self):
        try:
            return int((pathlib.Path(self.pgdata) / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def server_environ(self):
        """The postmaster's environment (every backend inherits it)."""
        return process_environ(self.postmaster_pid())

    def missing_server_env(self, wanted):
        """The entries of `wanted` that the running postmaster's environment lacks."""
        env = self.server_environ()
        return {k: v for k, v in wanted.items() if env.get(k) != v}

    # ---- sessions

    def connect(self, dbname="postgres", user="postgres", autocommit=True, statement_timeout_ms=None,
                connect_timeout=None, **kw):
        import psycopg  # here, so that the cluster commands work without the project's venv

        if statement_timeout_ms is not None:
            kw["options"] = f"-c statement_timeout={int(statement_timeout_ms)}"
        if connect_timeout is not None:
            kw["connect_timeout"] = connect_timeout
        return psycopg.connect(host=str(self.sockdir), port=self.port, user=user, dbname=dbname, autocommit=autocommit,
                               **kw)

    def create_db(self, name, extension=True, partitions=True):
        """A new database (dropped first if it exists), with the extension and, unless partitions=False,
        its first partitions (CREATE EXTENSION makes none; the first maintenance round does)."""
        with self.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
        if extension:
            with self.connect(name) as c:
                install_extension(c)
                if partitions:
                    c.execute("SELECT FROM idem_maintenance()")

    # ---- the server log

    def log_size(self):
        try:
            return self.logfile.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset=0):
        try:
            with open(self.logfile, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n=20):
        return "\n".join(self.log_since().splitlines()[-n:])


# ---------------------------------------------------------------------------------------------------
# Private copies of the installation, and the extension's files


def is_ext_file(name):
    return name == f"{EXT}.so" or name == f"{EXT}.control" or (name.startswith(f"{EXT}--") and name.endswith(".sql"))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ext_digest(lib_dir, ext_dir):
    """One digest over the extension's library, control file and scripts in two directories."""
    h = hashlib.sha256()
    for path in [pathlib.Path(lib_dir) / f"{EXT}.so", *sorted(pathlib.Path(ext_dir).glob(f"{EXT}*"))]:
        h.update(path.name.encode())
        h.update(sha256(path).encode())
    return h.hexdigest()


def system_ext_digest():
    """ext_digest of the extension installed into the system (what scripts/build installed)."""
    return ext_digest(pg().pkglibdir, pg().extdir)


def ext_files(source=None):
    """The extension's files in the system installation (what scripts/build installed), or anywhere
    under the directory `source` (e.g. a `cargo pgrx package` output directory)."""
    if source is not None:
        return sorted((p for p in pathlib.Path(source).rglob(f"{EXT}*") if p.is_file() and is_ext_file(p.name)),
                      key=lambda p: p.name)
    lib = pg().pkglibdir / f"{EXT}.so"
    files = [lib] if lib.exists() else []
    files += sorted(p for p in pg().extdir.iterdir() if is_ext_file(p.name))
    return files


def copy_ext_files(dest, source=None):
    """Copies the installed extension files (or those under `source`) into dest, over and over until the
    copy and the originals agree (an install running right now would otherwise leave a half-written
    library). Returns the copies."""
    dest = pathlib.Path(dest)
    for _ in range(10):
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        before = {p.name: sha256(p) for p in ext_files(source)}
        for p in ext_files(source):
            shutil.copy2(p, dest / p.name)
        time.sleep(1.0)
        after = {p.name: sha256(p) for p in ext_files(source)}
        copied = {p.name: sha256(p) for p in dest.iterdir()}
        if before == after == copied:
            return sorted(dest.iterdir())
    raise RuntimeError("the installed extension files kept changing while they were copied")


def control_default_version(path):
    for line in pathlib.Path(path).read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "default_version":
            return value.strip().strip("'")
    return None


class PrivateTree:
    """A copy of the PostgreSQL installation under `root` with idempotency files of our choice.

    PostgreSQL finds its library and share directories relative to its own executable. A tree with copies
    of postgres, initdb and pg_ctl, symlinks to everything else of the installation and the extension files
    we put there therefore runs those files, while the system installation (which `scripts/build` and
    `cargo pgrx test` rewrite in place, crashing every server that has the old library mapped) is never
    touched. `Cluster(..., bindir=tree.bin)` runs a cluster from it.
    """

    EXECUTABLES = ("postgres", "initdb", "pg_ctl")

    def __init__(self, root):
        paths = pg()
        self.root = pathlib.Path(root)
        self.bin = self.root / paths.bindir.relative_to("/")
        self.lib = self.root / paths.pkglibdir.relative_to("/")
        self.share = self.root / paths.sharedir.relative_to("/")
        self.ext = self.share / "extension"

    def build(self):
        """Makes the tree, without any idempotency file."""
        paths = pg()
        if self.root.exists():
            shutil.rmtree(self.root)
        for d in (self.bin, self.lib, self.ext):
            d.mkdir(parents=True)
        # Executables are copied: PostgreSQL resolves symlinks to find its own location.
        for exe in self.EXECUTABLES:
            shutil.copy2(paths.bindir / exe, self.bin / exe)
        for entry in paths.pkglibdir.iterdir():
            if not is_ext_file(entry.name):
                (self.lib / entry.name).symlink_to(entry)
        for entry in paths.sharedir.iterdir():
            if entry.name != "extension":
                (self.share / entry.name).symlink_to(entry)
        for entry in paths.extdir.iterdir():
            if not is_ext_file(entry.name):
                (self.ext / entry.name).symlink_to(entry)
        subprocess.run(["chmod", "-R", "a+rX", str(self.root)], check=True)

    def install(self, files):
        """Replaces the tree's idempotency files by `files` (the .so goes to lib, the rest to extension).
        New files, never rewritten in place: a server that still had the old library mapped keeps it."""
        for d in (self.lib, self.ext):
            for entry in d.iterdir():
                if is_ext_file(entry.name):
                    entry.unlink()
        for f in map(pathlib.Path, files):
            if not is_ext_file(f.name):
                raise ValueError(f"not a file of the extension: {f}")
            target = (self.lib if f.suffix == ".so" else self.ext) / f.name
            shutil.copy2(f, target)
            target.chmod(0o755 if f.suffix == ".so" else 0o644)

    def installed(self):
        return sorted(p.name for d in (self.lib, self.ext) for p in d.iterdir() if is_ext_file(p.name))

    def default_version(self):
        return control_default_version(self.ext / f"{EXT}.control")

    def digest(self):
        return ext_digest(self.lib, self.ext)


# ---------------------------------------------------------------------------------------------------
# Command line (scripts/cluster)


def _cli(argv):
    usage = ("usage: pgtools.py cluster start [conf lines...] | cluster stop | paths"
             " | install-extension HOST PORT DBNAME")
    if argv[:1] == ["paths"]:
        p = pg()
        for name in ("pg_config", "bindir", "pkglibdir", "sharedir", "pgxs", "version"):
            print(f"{name} {getattr(p, name)}")
        return 0
    if argv[:1] == ["install-extension"] and len(argv) == 4:
        import psycopg  # the project's venv

        try:
            with psycopg.connect(host=argv[1], port=int(argv[2]), dbname=argv[3], user="postgres",
                                 autocommit=True) as c:
                install_extension(c)
        except (RuntimeError, psycopg.Error) as e:
            print(f"install-extension: {e}", file=sys.stderr)
            return 1
        return 0
    if len(argv) < 2 or argv[0] != "cluster" or argv[1] not in ("start", "stop"):
        print(usage, file=sys.stderr)
        return 2
    env = os.environ
    port_ = int(env.get("IDEM_PORT") or port("default"))
    cluster = Cluster(port_, argv[2:], sockdir=env.get("IDEM_SOCKDIR"), pgdata=env.get("IDEM_PGDATA"))
    try:
        if argv[1] == "start":
            cluster.init()
            cluster.start()
        else:
            cluster.stop()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"cluster {argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
