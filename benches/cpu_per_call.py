"""Backend CPU microseconds per call, for the loops in WORKLOADS (see benches/cpu-per-call)."""
import os
import sys

import psycopg

CALLS = int(sys.argv[1])
USER = sys.argv[2] if len(sys.argv) > 2 else "postgres"
ROUNDS = 30  # one transaction per round: every key lock is held until commit
PER = CALLS // ROUNDS


def loop(body):
    return (f"DO $$ BEGIN FOR r IN 1..{ROUNDS} LOOP {body} COMMIT; END LOOP; END $$")


WORKLOADS = [
    ("floor: INSERT .. ON CONFLICT DO NOTHING", loop(
        f"FOR g IN 1..{PER} LOOP INSERT INTO floor_t VALUES ('f'||r||'-'||g) ON CONFLICT DO NOTHING; END LOOP;")),
    ("idem_once, new keys", loop(f"PERFORM idem_once('o'||r||'-'||g) FROM generate_series(1,{PER}) g;")),
    ("idem_once, duplicates", loop(f"PERFORM idem_once('o'||r||'-'||g) FROM generate_series(1,{PER}) g;")),
    ("idem_claim, new keys", loop(f"PERFORM idem_claim('c'||r||'-'||g) FROM generate_series(1,{PER}) g;")),
    ("idem_complete of those claims", loop(
        f"PERFORM idem_complete('c'||r||'-'||g, '{{\"ok\": true}}', token => (SELECT token FROM idem_status('c'||r||'-'||g))) FROM generate_series(1,{PER}) g;")),
    ("idem_claim + idem_complete, new keys (per pair)", loop(
        f"PERFORM idem_claim('p'||r||'-'||g) FROM generate_series(1,{PER}) g; "
        f"PERFORM idem_complete('p'||r||'-'||g, '{{\"ok\": true}}') FROM generate_series(1,{PER}) g;")),
    ("idem_claim, completed keys", loop(f"PERFORM idem_claim('c'||r||'-'||g) FROM generate_series(1,{PER}) g;")),
    ("idem_once_batch, 100 keys per call (per key)", loop(
        f"PERFORM idem_once_batch(ARRAY(SELECT 'b'||r||'-'||b||'-'||k FROM generate_series(1,100) k)) FROM generate_series(1,{PER // 100}) b;")),
]

conn = psycopg.connect(host=os.environ["IDEM_SOCKDIR"], port=int(os.environ["IDEM_PORT"]),
                       user=USER, dbname="postgres", autocommit=True)
pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
tick = os.sysconf("SC_CLK_TCK")


def cpu_seconds():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick


floor = None
print(f"{'workload':48s} {'us/call':>8s} {'x floor':>8s}")
for name, sql in WORKLOADS:
    before = cpu_seconds()
    conn.execute(sql)
    us = (cpu_seconds() - before) * 1e6 / CALLS
    floor = floor or us
    print(f"{name:48s} {us:8.1f} {us / floor:8.2f}")
