"""A Citus cluster on loopback for the scale-out tests: a coordinator and two workers, each a throwaway
PostgreSQL 15 cluster run from a private copy of the installation (pgtools.PrivateTree) holding the
idempotency files under test; Citus's own files (citus.so, its control and scripts) are the system's,
seen through the tree's symlinks. Every node preloads 'citus,idempotency' and its maintenance worker looks
after the test database.

    python3 tests/citus/citus_cluster.py start|stop     # by hand, for exploring (IDEM_EXT_DIR as in run)
"""
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import pgtools  # noqa: E402

DB = "app"
TREE = "/tmp/idem-citus-inst"
NAMES = ("coordinator", "worker1", "worker2")


def ext_files_under_test():
    """The idempotency files to test: those under IDEM_EXT_DIR (e.g. a `cargo pgrx package` output
    directory) when it is set, else the ones scripts/build installed into the system."""
    src = os.environ.get("IDEM_EXT_DIR")
    files = pgtools.ext_files(src) if src else pgtools.ext_files()
    if not any(f.name == "idempotency.so" for f in files):
        raise RuntimeError(f"no idempotency.so under {src or pgtools.pg().pkglibdir}")
    return files


def citus_installed():
    return (pgtools.pg().pkglibdir / "citus.so").exists() and (pgtools.pg().extdir / "citus.control").exists()


class Node(pgtools.Cluster):
    def __init__(self, name, port, tree, conf=(), fsync="off"):
        super().__init__(port, ["log_line_prefix = '%m [%p] %e '",
                                "shared_preload_libraries = 'citus,idempotency'",
                                "max_prepared_transactions = 100",
                                "wal_level = logical",
                                f"idempotency.database = '{DB}'",
                                "idempotency.maintenance_interval = '1s'",
                                "citus.log_remote_commands = off",
                                # 2PC recovery is the test's to run, explicitly, until a test turns it on.
                                "citus.recover_2pc_interval = -1",
                                "max_connections = 120",
                                *conf],
                         bindir=tree.bin, listen="127.0.0.1", max_connections=120, fsync=fsync, server_env={})
        self.name = name

    def connect(self, dbname=DB, autocommit=True, **kw):
        kw.setdefault("statement_timeout_ms", 60000)
        kw.setdefault("connect_timeout", 10)
        return super().connect(dbname, autocommit=autocommit, **kw)

    def sql(self, query, params=None, dbname=DB):
        with self.connect(dbname) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None

    def start(self, timeout=120):
        super().start(timeout=timeout)

    def kill9(self):
        """kill -9 of the postmaster and of every process of this server (a machine losing power)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        for p in [pid, *map(int, children)]:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        deadline = time.time() + 30
        while time.time() < deadline:
            alive = [p for p in [pid, *map(int, children)] if os.path.exists(f"/proc/{p}")]
            if not alive:
                break
            time.sleep(0.05)
        # The postmaster.pid stays behind, as after a power loss; pg_ctl start copes with it.


class CitusCluster:
    def __init__(self, fsync="off"):
        ports = pgtools.ports("citus")
        self.tree = pgtools.PrivateTree(TREE)
        self.nodes = [Node(n, ports[i], self.tree, fsync=fsync) for i, n in enumerate(NAMES)]
        self.coord, self.w1, self.w2 = self.nodes
        self.workers = [self.w1, self.w2]

    def by_port(self, port):
        return next(n for n in self.nodes if n.port == port)

    def build(self):
        if not citus_installed():
            raise RuntimeError("Citus is not installed into PostgreSQL 15: run tests/citus/install-deps")
        self.tree.build()
        self.tree.install(ext_files_under_test())

    def start(self):
        """Fresh data directories, every node started, Citus and the extension created (on the coordinator;
        Citus propagates CREATE EXTENSION idempotency to the workers), the workers added."""
        for n in self.nodes:
            n.init(stop_mode="immediate")
            n.start()
        for n in self.nodes:
            with n.connect("postgres") as c:
                c.execute(f"CREATE DATABASE {DB}")
            with n.connect() as c:
                c.execute("CREATE EXTENSION citus")
        with self.coord.connect() as c:
            c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (self.coord.port,))
            for w in self.workers:
                c.execute("SELECT citus_add_node('127.0.0.1', %s)", (w.port,))
            c.execute("CREATE EXTENSION idempotency")
            c.execute("SELECT FROM idem_maintenance()")
        for w in self.workers:
            with w.connect() as c:
                c.execute("SELECT FROM idem_maintenance()")

    def stop(self):
        for n in self.nodes:
            try:
                n.stop("immediate" if n.name != "coordinator" else "fast", timeout=60)
            except Exception:  # noqa: BLE001 - stopping is best effort, each node on its own
                pass

    def crash_lines(self):
        out = []
        for n in self.nodes:
            out += [f"{n.name}: {line}" for line in pgtools.crash_lines(n.log_since())]
        return out


def _cli(argv):
    cl = CitusCluster()
    if argv[:1] == ["start"]:
        cl.build()
        cl.start()
        print(" ".join(f"{n.name}={n.port}" for n in cl.nodes))
        return 0
    if argv[:1] == ["stop"]:
        cl.stop()
        return 0
    print("usage: citus_cluster.py start|stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
