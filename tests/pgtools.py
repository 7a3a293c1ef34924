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
  `native_only(reason)` for what only the native extension has;
* a fake clock for every server a run starts (IDEM_FAKE_CLOCK, a libfaketime offset such as `+3600`:
  tests/fakeclock.py), so that a whole suite can run across midnight UTC on purpose.

The paths, the editions and the private trees live in pgpaths.py, pgedition.py and pginstall.py, re-exported
here.

The module needs nothing beyond the standard library until a connection is opened (psycopg), so
scripts/cluster runs it with the system's python3:

    python3 tests/pgtools.py cluster start [postgresql.conf lines...]   # IDEM_PORT, IDEM_SOCKDIR, IDEM_PGDATA
    python3 tests/pgtools.py cluster stop
    python3 tests/pgtools.py paths                                       # what pg() found
    python3 tests/pgtools.py install-extension HOST PORT DBNAME          # install_extension() there
"""
import contextlib
import functools
import os
import pathlib
import pwd
import subprocess
import sys
import uuid

# Parts of this module kept in files of their own, re-exported here (callers import them from pgtools).
import fakeclock
from pgedition import (EDITION_OWNER, EDITIONS, edition, edition_conf, install_extension,  # noqa: F401
                       native_only, sql_edition, sql_edition_script)
from pginstall import (PrivateTree, control_default_version, copy_ext_files, ext_digest, ext_files,  # noqa: F401
                       is_ext_file, sha256, system_ext_digest)
from pgpaths import EXT, FALLBACK_PG_CONFIG, PgPaths, find_pg_config, pg  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]

# What a client retries: the whole transaction, from BEGIN (serialization_failure, deadlock_detected).
RETRY_SQLSTATES = ("40001", "40P01")

# The environment of test servers whose errors are checked for Rust internals: with RUST_BACKTRACE=1 pgrx
# appends a Rust backtrace to the DETAIL of an error that crossed the extension's frames, unless the
# extension prevents it, so a check for one can only fail with the variable set.
BACKTRACE_ENV = {"RUST_BACKTRACE": "1"}

# Crash signatures in a server log: a backend or worker that died of a signal, an assertion, a PANIC.
CRASH_PATTERNS = ("PANIC:", "TRAP:", "terminated by signal", "was terminated by", "server process (PID",
                  "terminating any other active server processes", "all server processes terminated")

@contextlib.contextmanager
def own_database(cluster, prefix):
    """A database of the caller's own on `cluster` (anything with `connect(dbname=...)`), with the extension
    installed and its first partitions made: for tests whose triggers, indexes or sealed partitions must reach
    no other test. Dropped at the end, whatever its connections."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with cluster.connect(dbname="postgres") as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        with cluster.connect(dbname=name) as c:
            install_extension(c)
            c.execute("SELECT FROM idem_maintenance()")
        yield name
    finally:
        with cluster.connect(dbname="postgres") as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


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
        # Under IDEM_FAKE_CLOCK every server runs with libfaketime's clock (fakeclock.py); a caller's own
        # clock settings in server_env win.
        env = [f"{k}={v}" for k, v in {**fakeclock.env_from_caller(), **self.server_env}.items()]
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
