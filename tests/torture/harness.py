"""Shared machinery of the torture suites: clusters, connections, errors, figures.

Every suite runs against a throwaway PostgreSQL 15 cluster of its own, owned by the postgres user, on
a private port in 54350-54359 and a private socket directory (/tmp/idem-sock-PORT, data in
/tmp/idem-data-PORT), started and stopped by the harness.

Where the server binaries come from
-----------------------------------
By default the harness runs its clusters from a *snapshot* of the installed PostgreSQL 15 and of the
installed extension (`/tmp/idem-torture-inst`, rebuilt at every run): the postgres, initdb and pg_ctl
executables and the extension's files are copied, everything else is a symlink to the system
installation. PostgreSQL finds its library and share directories relative to its executable, so a
cluster started from the snapshot loads the snapshot's `idempotency.so`. The reason: installing the
extension (`scripts/build`, `cargo pgrx test`) rewrites `idempotency.so` in place, and every running
server that has it mapped then executes garbage (SIGILL or SIGSEGV in idempotency.so, crash
recovery). A torture run that lasts minutes on a machine where somebody rebuilds the extension would
report crashes that are not the extension's. `--system-install` runs the clusters straight from the
system installation through scripts/cluster instead.
"""
import hashlib
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from idemlib import RUST_INTERNALS, rust_internals  # noqa: E402,F401 - one list for every suite and test

SYSTEM_BIN = pathlib.Path("/usr/lib/postgresql/15/bin")
SYSTEM_LIB = pathlib.Path("/usr/lib/postgresql/15/lib")
SYSTEM_SHARE = pathlib.Path("/usr/share/postgresql/15")
SNAPSHOT = pathlib.Path("/tmp/idem-torture-inst")
EXT_FILES_LIB = ("idempotency.so",)

RETRY_SQLSTATES = ("40001", "40P01")

# The environment every torture server runs with. RUST_BACKTRACE=1 makes pgrx append a Rust backtrace
# to the DETAIL of an error that crossed the extension's frames, if the extension lets it: the suites
# check that no error a client sees carries one (rust_internals), which they can only catch with it set.
SERVER_ENV = {"RUST_BACKTRACE": "1"}


def log(msg):
    print(f"    {msg}", flush=True)


def as_postgres(args, **kw):
    """Runs a command as the postgres OS user (initdb and pg_ctl refuse root)."""
    if os.geteuid() == 0:
        args = ["sudo", "-u", "postgres", "-H", *args]
    return subprocess.run(args, **kw)


def close_quietly(conn):
    """Closes a connection that may already be broken (a killed backend, a restarted server)."""
    if conn is None:
        return
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - it is gone either way
        pass


def is_connection_error(e, conn=None):
    """True when an exception means the session is gone (server crash, restart, shutdown)."""
    if conn is not None and getattr(conn, "broken", False):
        return True
    st = getattr(e, "sqlstate", None)
    if st:
        return st.startswith("08") or st in ("57P01", "57P02", "57P03", "57P04")
    return isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError))


def sqlstate(e):
    return getattr(e, "sqlstate", None)


# ---------------------------------------------------------------------------------------------------
# Installation snapshot


class Install:
    """Where the server executables come from: the system installation or a private snapshot."""

    def __init__(self, snapshot=True):
        self.snapshot = snapshot
        self.bin = SNAPSHOT / "usr/lib/postgresql/15/bin" if snapshot else SYSTEM_BIN
        self.library = (SNAPSHOT / "usr/lib/postgresql/15/lib" if snapshot else SYSTEM_LIB) / "idempotency.so"
        self.digest = None

    def prepare(self):
        if not self.snapshot:
            self.digest = _ext_digest(SYSTEM_LIB, SYSTEM_SHARE / "extension")
            return
        # Copy the extension's files twice over until two copies agree: an install running right now
        # would otherwise leave a half-written library in the snapshot.
        for _ in range(10):
            first = self._build()
            time.sleep(1.0)
            if first == _ext_digest(SYSTEM_LIB, SYSTEM_SHARE / "extension") and \
                    first == _ext_digest(self.library.parent, SNAPSHOT / "usr/share/postgresql/15/extension"):
                self.digest = first
                return
        raise RuntimeError("the installed idempotency.so kept changing while it was copied")

    def _build(self):
        if SNAPSHOT.exists():
            shutil.rmtree(SNAPSHOT)
        bin_dir = SNAPSHOT / "usr/lib/postgresql/15/bin"
        lib_dir = SNAPSHOT / "usr/lib/postgresql/15/lib"
        share_dir = SNAPSHOT / "usr/share/postgresql/15"
        ext_dir = share_dir / "extension"
        for d in (bin_dir, lib_dir, ext_dir):
            d.mkdir(parents=True)
        # Executables are copied: PostgreSQL resolves symlinks to find its own location.
        for exe in ("postgres", "initdb", "pg_ctl"):
            shutil.copy2(SYSTEM_BIN / exe, bin_dir / exe)
        for entry in SYSTEM_LIB.iterdir():
            if entry.name not in EXT_FILES_LIB:
                (lib_dir / entry.name).symlink_to(entry)
        for entry in SYSTEM_SHARE.iterdir():
            if entry.name != "extension":
                (share_dir / entry.name).symlink_to(entry)
        for entry in (SYSTEM_SHARE / "extension").iterdir():
            if entry.name.startswith("idempotency"):
                shutil.copy2(entry, ext_dir / entry.name)
            else:
                (ext_dir / entry.name).symlink_to(entry)
        digest = _ext_digest(SYSTEM_LIB, SYSTEM_SHARE / "extension")
        shutil.copy2(SYSTEM_LIB / "idempotency.so", lib_dir / "idempotency.so")
        subprocess.run(["chmod", "-R", "a+rX", str(SNAPSHOT)], check=True)
        return digest

    def describe(self):
        where = SNAPSHOT if self.snapshot else "system installation"
        return f"{where} (extension files sha256 {self.digest[:12]})"

    def system_library_changed(self):
        """True when the system's idempotency.so is not the one this run started with."""
        try:
            return _ext_digest(SYSTEM_LIB, SYSTEM_SHARE / "extension") != self.digest
        except OSError:
            return True


def _ext_digest(lib_dir, ext_dir):
    """One digest over the extension's library, control file and scripts."""
    h = hashlib.sha256()
    for path in [pathlib.Path(lib_dir) / "idempotency.so", *sorted(pathlib.Path(ext_dir).glob("idempotency*"))]:
        h.update(path.name.encode())
        h.update(_sha256(path).encode())
    return h.hexdigest()


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# Clusters

BASE_CONF = [
    # Unix socket only: a TCP port in the ephemeral range can be taken by any outgoing connection of
    # the machine at the moment the server starts (bind: Address already in use).
    "listen_addresses = ''",
    # A runaway statement must never fill the disk of the machine.
    "temp_file_limit = '512MB'",
    "deadlock_timeout = '100ms'",
    "log_line_prefix = '%m [%p] %e '",
]

_RUNNING = []  # clusters started and not yet stopped, for the emergency stop
_RUNNING_LOCK = threading.Lock()


class Cluster:
    def __init__(self, install, port, conf=()):
        assert 54350 <= port <= 54359, port
        self.install = install
        self.port = port
        self.sockdir = f"/tmp/idem-sock-{port}"
        self.pgdata = f"/tmp/idem-data-{port}"
        self.logfile = pathlib.Path(self.pgdata) / "server.log"
        self.conf = [*BASE_CONF, *conf]

    def _env(self):
        # scripts/cluster hands SERVER_ENV on to pg_ctl through sudo (scripts/lib.sh, as_postgres).
        return dict(os.environ, IDEM_PORT=str(self.port), IDEM_SOCKDIR=self.sockdir, IDEM_PGDATA=self.pgdata,
                    **SERVER_ENV)

    def start(self):
        if self.install.snapshot:
            self._pg_ctl("stop", "-m", "immediate", check=False, quiet=True)
            subprocess.run(["rm", "-rf", self.pgdata, self.sockdir], check=True)
            subprocess.run(["install", "-d", "-o", "postgres", "-g", "postgres", self.sockdir], check=True)
            as_postgres([str(self.install.bin / "initdb"), "-D", self.pgdata, "-A", "trust", "-U", "postgres",
                         "--no-sync"], check=True, stdout=subprocess.DEVNULL)
            # The same settings as scripts/cluster, then ours.
            lines = [f"port = {self.port}", "listen_addresses = '127.0.0.1'",
                     f"unix_socket_directories = '{self.sockdir}'", "max_connections = 200", "fsync = on",
                     *self.conf]
            as_postgres(["tee", "-a", f"{self.pgdata}/postgresql.conf"], input="\n".join(lines) + "\n",
                        text=True, check=True, stdout=subprocess.DEVNULL)
            self._pg_ctl("start", "-l", str(self.logfile), "-w", "-t", "120")
        else:
            subprocess.run([str(ROOT / "scripts" / "cluster"), "start", *self.conf], env=self._env(), check=True,
                           stderr=subprocess.DEVNULL)
        with _RUNNING_LOCK:
            _RUNNING.append(self)
        self.check_server_env()

    def check_server_env(self):
        """The postmaster (and so every backend) runs with SERVER_ENV, or the suites' checks for Rust
        internals in errors could not fail."""
        pid = self.postmaster_pid()
        try:
            env = dict(kv.split("=", 1) for kv in pathlib.Path(f"/proc/{pid}/environ").read_text(
                errors="replace").split("\0") if "=" in kv)
        except OSError as e:
            raise RuntimeError(f"cannot read the environment of the postmaster {pid}: {e}") from e
        missing = {k: v for k, v in SERVER_ENV.items() if env.get(k) != v}
        if missing:
            raise RuntimeError(f"the server on port {self.port} runs without {missing} in its environment")

    def _pg_ctl(self, *args, check=True, quiet=False):
        out = subprocess.DEVNULL if quiet else subprocess.PIPE
        # sudo resets the environment: hand SERVER_ENV to pg_ctl (and so to the server) explicitly.
        env = [f"{k}={v}" for k, v in SERVER_ENV.items()]
        r = as_postgres(["env", *env, str(self.install.bin / "pg_ctl"), "-D", self.pgdata, *args], stdout=out,
                        stderr=out, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {r.stdout} {r.stderr}")
        return r

    def stop(self):
        if os.path.isdir(self.pgdata):
            self._pg_ctl("stop", "-m", "fast", "-w", check=False, quiet=True)
        with _RUNNING_LOCK:
            if self in _RUNNING:
                _RUNNING.remove(self)

    def stop_immediate(self):
        """pg_ctl stop -m immediate: the server exits without a checkpoint; the next start recovers."""
        self._pg_ctl("stop", "-m", "immediate", "-w")

    def start_again(self):
        """Starts the existing data directory again (crash recovery after an immediate stop)."""
        self._pg_ctl("start", "-l", str(self.logfile), "-w", "-t", "300")
        self.check_server_env()

    def connect(self, dbname="postgres", user="postgres", autocommit=True, timeout_ms=60000, **kw):
        return psycopg.connect(host=self.sockdir, port=self.port, user=user, dbname=dbname, autocommit=autocommit,
                               connect_timeout=10, options=f"-c statement_timeout={int(timeout_ms)}", **kw)

    def wait_ready(self, dbname="postgres", timeout=180):
        """Waits until a session can be opened (after a crash the postmaster recovers first)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                with self.connect(dbname) as c:
                    c.execute("SELECT 1")
                    return
            except psycopg.Error as e:
                last = e
                time.sleep(0.2)
        raise RuntimeError(f"cluster on port {self.port} not ready after {timeout}s: {last}")

    def postmaster_pid(self):
        try:
            return int((pathlib.Path(self.pgdata) / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def children(self, title):
        """Pids of the postmaster's children whose process title contains `title`."""
        pm = self.postmaster_pid()
        if pm is None:
            return []
        out = subprocess.run(["pgrep", "-P", str(pm), "-f", title], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def launcher_pid(self):
        found = self.children("idempotency launcher")
        return found[0] if found else None

    def log_size(self):
        try:
            return self.logfile.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset):
        try:
            with open(self.logfile, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def create_db(self, name, extension=True):
        with self.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
        if extension:
            with self.connect(name) as c:
                c.execute("CREATE EXTENSION idempotency")
                c.execute("SELECT FROM idem_maintenance()")  # the first partitions


def stop_all_clusters():
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for c in running:
        try:
            c.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


# Crash signatures in a server log: a backend or worker that died of a signal, an assertion, a PANIC.
CRASH_PATTERNS = ("PANIC:", "TRAP:", "terminated by signal", "was terminated by", "server process (PID",
                  "terminating any other active server processes", "all server processes terminated")


def crash_lines(text):
    return [line for line in text.splitlines() if any(p in line for p in CRASH_PATTERNS)]


# ---------------------------------------------------------------------------------------------------
# Results


@dataclass
class Result:
    name: str
    figures: dict = field(default_factory=dict)
    violations: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    error: str = None
    seconds: float = 0.0

    def violation(self, text):
        self.violations.append(text)

    def note(self, text):
        self.notes.append(text)

    @property
    def passed(self):
        return self.error is None and not self.violations


class Counter:
    """Thread-safe counters."""

    def __init__(self):
        self._lock = threading.Lock()
        self.values = {}

    def add(self, name, n=1):
        with self._lock:
            self.values[name] = self.values.get(name, 0) + n

    def get(self, name):
        with self._lock:
            return self.values.get(name, 0)


def seeded(seed, *parts):
    """A random generator derived from the run's seed and a name, so suites are reproducible."""
    return random.Random(f"{seed}:" + ":".join(str(p) for p in parts))


def table_digest(conn):
    """Row counts and a digest of the storage tables and of the partition list (as superuser)."""
    row = conn.execute("""
        SELECT (SELECT count(*) FROM idempotency.records),
               (SELECT coalesce(md5(string_agg(r::text, '|' ORDER BY r.scope, r.key)), '')
                  FROM idempotency.records r),
               (SELECT count(*) FROM idempotency.offsets),
               (SELECT coalesce(md5(string_agg(o::text, '|' ORDER BY o.consumer_group, o.topic, o.partition)), '')
                  FROM idempotency.offsets o),
               (SELECT coalesce(string_agg(partition::text, ',' ORDER BY partition::text), '')
                  FROM idempotency.partitions)""").fetchone()
    return row


def kill9(pid):
    os.kill(pid, signal.SIGKILL)
