"""What a delegated call costs: the same workloads with pgbench against

  single     one PostgreSQL node without Citus (idempotency preloaded), the reference;
  worker     a Citus worker directly, for a tenant whose shard it holds (Citus plans the call, runs it locally);
  coord      the Citus coordinator, which delegates each call to that worker (one more network hop, and the
             coordinator's distributed planning and transaction);

all nodes on this machine (loopback), fsync on, synchronous_commit on. Workloads, new keys every time:

  once       SELECT idem_once(key, tenant), one per transaction;
  consumer   BEGIN; idem_claim; INSERT a business row; idem_complete; COMMIT (one tenant: one node);
  batch100   SELECT count(*) FROM idem_once_batch(100 new keys of one tenant): keys/s = 100 x tx/s;
  poll2      BEGIN; idem_once + business row for a tenant on worker1 AND one on worker2; idem_record_offset
             (the coordinator's offsets); COMMIT (through the coordinator: two-phase commit over three nodes;
             on the single node: one local commit).

Then the spread: records per worker after keys of 64 tenants went through the coordinator.
Prints a Markdown table. Usage: tests/citus/bench [--seconds N] [--clients 1,8]
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import pgtools  # noqa: E402
from citus_cluster import DB, CitusCluster  # noqa: E402

LEDGER = "CREATE TABLE ledger (tenant text NOT NULL, msg text NOT NULL, amount int)"

SCRIPTS = {
    "once": """\\set k random(1, 2000000000)
SELECT idem_once(:k::text || '-' || :client_id::text, '{t1}');
""",
    "consumer": """\\set k random(1, 2000000000)
BEGIN;
SELECT outcome FROM idem_claim('c' || :k::text || '-' || :client_id::text, NULL, '{t1}');
INSERT INTO ledger (tenant, msg, amount) VALUES ('{t1}', 'c' || :k::text || '-' || :client_id::text, 1);
SELECT idem_complete('c' || :k::text || '-' || :client_id::text, NULL, '{t1}');
COMMIT;
""",
    "poll2": """\\set k random(1, 2000000000)
BEGIN;
SELECT idem_once('p' || :k::text || '-' || :client_id::text, '{t1}');
INSERT INTO ledger (tenant, msg, amount) VALUES ('{t1}', 'p' || :k::text || '-' || :client_id::text, 1);
SELECT idem_once('p' || :k::text || '-' || :client_id::text, '{t2}');
INSERT INTO ledger (tenant, msg, amount) VALUES ('{t2}', 'p' || :k::text || '-' || :client_id::text, 1);
SELECT idem_record_offset('bench', 'orders', :client_id, :k);
COMMIT;
""",
    # 100 new keys of one tenant in one call: one hop to the worker for all of them.
    "batch100": "\\set k random(1, 2000000000)\nSELECT count(*) FROM idem_once_batch(ARRAY[" + ", ".join(
        f"'b' || :k::text || '-' || :client_id::text || '-{i}'" for i in range(100)) + "], '{t1}');\n",
}


def pgbench(port, script, clients, seconds):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    os.chmod(f.name, 0o644)
    r = subprocess.run([str(pgtools.pg().bindir / "pgbench"), "-n", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                        "-M", "simple", "-c", str(clients), "-j", str(clients), "-T", str(seconds), "-f", f.name, DB],
                       capture_output=True, text=True)
    os.unlink(f.name)
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", r.stdout)
    lat = re.search(r"latency average = ([0-9.]+) ms", r.stdout)
    failed = re.search(r"number of failed transactions: ([0-9]+)", r.stdout)
    if r.returncode != 0 or not tps:
        raise RuntimeError(f"pgbench failed: {r.stdout[-1500:]} {r.stderr[-1500:]}")
    return float(tps.group(1)), float(lat.group(1)), int(failed.group(1)) if failed else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--clients", default="1,8")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    cl = CitusCluster(fsync="on")
    single = pgtools.Cluster(pgtools.port("citus", 3), ["shared_preload_libraries = 'idempotency'",
                                                       f"idempotency.database = '{DB}'"],
                             bindir=cl.tree.bin, max_connections=120, fsync="on", server_env={})
    try:
        cl.build()
        cl.start()
        single.init()
        single.start()
        with single.connect("postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {DB}")
        with single.connect(DB, autocommit=True) as c:
            c.execute("CREATE EXTENSION idempotency")
            c.execute("SELECT FROM idem_maintenance()")
            c.execute(LEDGER)
        with cl.coord.connect() as c:
            c.execute(LEDGER)
            c.execute("SELECT create_distributed_table('ledger', 'tenant', shard_count := 32)")
            c.execute("SELECT count(*) FROM idem_distribute('ledger')")
            port_of = lambda t: c.execute(  # noqa: E731
                "SELECT nodeport FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('ledger', %s::text)",
                (t,)).fetchone()[0]
            t1 = next(f"tenant-{i}" for i in range(100) if port_of(f"tenant-{i}") == cl.w1.port)
            t2 = next(f"tenant-{i}" for i in range(100) if port_of(f"tenant-{i}") == cl.w2.port)
        targets = [("single", single.port), ("worker", cl.w1.port), ("coord", cl.coord.port)]
        rows = []
        print(f"# tests/citus/bench --seconds {args.seconds} --clients {args.clients}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        print("| workload | clients | single node tx/s (ms) | Citus worker direct tx/s (ms) | through the coordinator tx/s (ms) | coordinator / single |")
        print("|---|---:|---:|---:|---:|---:|", flush=True)
        for wl, script in SCRIPTS.items():
            for n in clients:
                res = {}
                for name, port in targets:
                    if wl == "poll2" and name == "worker":
                        res[name] = None  # spans both workers: only the coordinator (or one node) can run it
                        continue
                    res[name] = pgbench(port, script.format(t1=t1, t2=t2), n, args.seconds)
                cells = [f"{r[0]:,.0f} ({r[1]:.2f})" if r else "n/a" for r in (res["single"], res["worker"], res["coord"])]
                ratio = res["coord"][0] / res["single"][0]
                rows.append((wl, n, res))
                print(f"| {wl} | {n} | " + " | ".join(cells) + f" | {ratio:.2f} |", flush=True)
        # The spread: keys of 64 tenants through the coordinator.
        with cl.coord.connect() as c:
            for i in range(64):
                # The keys as a parameter: an ARRAY(SELECT ...) argument is a subquery, which Citus does not delegate.
                c.execute("SELECT idem_once_batch(%s, %s)", ([f"spread-{g}" for g in range(50)], f"spread-tenant-{i}"))
        counts = {w.name: w.sql("SELECT count(*) FROM idempotency.records WHERE key LIKE 'spread-%'")[0][0] for w in cl.workers}
        shards = {w.name: w.sql("SELECT count(*) FROM citus_shards WHERE table_name = 'ledger'::regclass AND nodeport = %s",
                                (w.port,))[0][0] for w in cl.workers}
        print()
        print("spread of 64 tenants x 50 keys through the coordinator (32 shards): " +
              ", ".join(f"{k} {counts[k]} records, {shards[k]} shards" for k in counts))
    finally:
        single.stop()
        cl.stop()


if __name__ == "__main__":
    main()
