"""Shared machinery of the torture suites: clusters, connections, errors, figures.

Every suite runs against a throwaway PostgreSQL 15 cluster of its own (pgtools.Cluster), owned by the
postgres user, on a private port of the range "torture" of tests/ports and a private socket directory
(/tmp/idem-sock-PORT, data in /tmp/idem-data-PORT), started and stopped by the harness.

Where the server binaries come from
-----------------------------------
By default the harness runs its clusters from a *snapshot* of the installed PostgreSQL 15 and of the
installed extension (`/tmp/idem-torture-inst`, a pgtools.PrivateTree rebuilt at every run): the postgres,
initdb and pg_ctl executables and the extension's files are copied, everything else is a symlink to the
system installation. PostgreSQL finds its library and share directories relative to its executable, so a
cluster started from the snapshot loads the snapshot's `idempotency.so`. The reason: installing the
extension (`scripts/build`, `cargo pgrx test`) rewrites `idempotency.so` in place, and every running
server that has it mapped then executes garbage (SIGILL or SIGSEGV in idempotency.so, crash
recovery). A torture run that lasts minutes on a machine where somebody rebuilds the extension would
report crashes that are not the extension's. `--system-install` runs the clusters straight from the
system installation instead.
"""
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import pgtools  # noqa: E402
from idemlib import RUST_INTERNALS, rust_internals  # noqa: E402,F401 - one list for every suite and test
from pgtools import RETRY_SQLSTATES, crash_lines  # noqa: E402,F401 - for the suites

SNAPSHOT = pathlib.Path("/tmp/idem-torture-inst")
PORTS = pgtools.ports("torture")

# The environment every torture server runs with. RUST_BACKTRACE=1 makes pgrx append a Rust backtrace
# to the DETAIL of an error that crossed the extension's frames, if the extension lets it: the suites
# check that no error a client sees carries one (rust_internals), which they can only catch with it set.
SERVER_ENV = pgtools.BACKTRACE_ENV


def port(i):
    """The port of the suite numbered i (0-based) in the range "torture" of tests/ports."""
    return pgtools.port("torture", i)


def log(msg):
    print(f"    {msg}", flush=True)


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
        self.tree = pgtools.PrivateTree(SNAPSHOT) if snapshot else None
        self.bin = self.tree.bin if snapshot else pgtools.pg().bindir
        self.library = (self.tree.lib if snapshot else pgtools.pg().pkglibdir) / "idempotency.so"
        self.digest = None

    def prepare(self):
        if not self.snapshot:
            self.digest = pgtools.system_ext_digest()
            return
        # The extension's files are copied over and over until the copy and the installed files agree:
        # an install running right now would otherwise leave a half-written library in the snapshot.
        self.tree.build()
        self.tree.install(pgtools.copy_ext_files(SNAPSHOT / "staged"))
        if not self.library.exists():
            raise RuntimeError(f"no idempotency.so in {pgtools.pg().pkglibdir}: run scripts/build")
        self.digest = self.tree.digest()

    def describe(self):
        where = SNAPSHOT if self.snapshot else "system installation"
        return f"{where} (extension files sha256 {self.digest[:12]})"

    def system_library_changed(self):
        """True when the system's idempotency.so is not the one this run started with."""
        try:
            return pgtools.system_ext_digest() != self.digest
        except OSError:
            return True


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


class Cluster(pgtools.Cluster):
    def __init__(self, install, port, conf=()):
        assert port in PORTS, port
        # The settings of every cluster of the project (pgtools.Cluster), then BASE_CONF, then the suite's.
        super().__init__(port, [*BASE_CONF, *conf], bindir=install.bin, server_env=SERVER_ENV)
        self.install = install

    def start(self):
        self.init(stop_mode="immediate")
        with _RUNNING_LOCK:
            _RUNNING.append(self)  # before pg_ctl: a start that fails half-way is still stopped
        super().start(timeout=120)
        self.check_server_env()

    def check_server_env(self):
        """The postmaster (and so every backend) runs with SERVER_ENV, or the suites' checks for Rust
        internals in errors could not fail."""
        pid = self.postmaster_pid()
        try:
            missing = self.missing_server_env(SERVER_ENV)
        except OSError as e:
            raise RuntimeError(f"cannot read the environment of the postmaster {pid}: {e}") from e
        if missing:
            raise RuntimeError(f"the server on port {self.port} runs without {missing} in its environment")

    def stop(self):
        super().stop("fast")
        with _RUNNING_LOCK:
            if self in _RUNNING:
                _RUNNING.remove(self)

    def stop_immediate(self):
        """pg_ctl stop -m immediate: the server exits without a checkpoint; the next start recovers."""
        self.pg_ctl("stop", "-m", "immediate", "-w")

    def start_again(self):
        """Starts the existing data directory again (crash recovery after an immediate stop)."""
        super().start(timeout=300)
        self.check_server_env()

    def connect(self, dbname="postgres", user="postgres", autocommit=True, timeout_ms=60000, **kw):
        return super().connect(dbname, user, autocommit, statement_timeout_ms=timeout_ms, connect_timeout=10, **kw)

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


def stop_all_clusters():
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for c in running:
        try:
            c.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


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
