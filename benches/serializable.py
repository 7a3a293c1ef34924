"""Issue 29's scenario: SERIALIZABLE consumers, the serialization failures each pattern causes and the tries
a delivery needs (`benches/run --serializable`). Started by benches/run, whose throwaway cluster it uses.

- 8 consumer sessions, `default_transaction_isolation = 'serializable'`;
- 400 messages, each delivered 1 to 4 times: in random order with random string keys, or with sequential
  keys (a broker's offsets) whose deliveries arrive together;
- a 40001 is retried at once, as a consumer loop does, up to 50 tries;
- the business write is one INSERT into a plain table; after each round every message must have exactly
  one business row (the run fails otherwise);
- every pattern runs on the same cluster in the same run, rounds alternating between patterns.
"""
import json
import os
import queue
import random
import threading
import time
import uuid

import psycopg

from runner import log, conninfo, so_sha256

SESSIONS = 8
MESSAGES = 400
MAX_TRIES = 50

PATTERNS = {
    "hand_claim": "hand-written: INSERT 'PENDING' ... ON CONFLICT DO NOTHING RETURNING, business insert, UPDATE 'COMPLETED'",
    "ext_claim": "idem_claim, business insert, idem_complete",
    "hand_once": "hand-written: INSERT ... ON CONFLICT DO NOTHING RETURNING, business insert",
    "ext_once": "idem_once, business insert",
}
# Which hand-written pattern each extension pattern is compared with.
MATCH = {"ext_claim": "hand_claim", "ext_once": "hand_once"}

SCHEMA = """
DROP TABLE IF EXISTS ser_hand_claim, ser_hand_once, ser_business;
CREATE TABLE ser_hand_claim (key text PRIMARY KEY, status text NOT NULL);
CREATE TABLE ser_hand_once (key text PRIMARY KEY);
CREATE TABLE ser_business (key text NOT NULL, amount int NOT NULL);
GRANT ALL ON ser_hand_claim, ser_hand_once, ser_business TO PUBLIC;
"""


def deliver(cur, pattern, scope, key):
    """One delivery, in the open transaction of `cur`."""
    if pattern == "hand_claim":
        cur.execute("INSERT INTO ser_hand_claim VALUES (%s, 'PENDING') ON CONFLICT DO NOTHING RETURNING 1", (key,))
        if cur.fetchone():
            cur.execute("INSERT INTO ser_business VALUES (%s, 42)", (key,))
            cur.execute("UPDATE ser_hand_claim SET status = 'COMPLETED' WHERE key = %s", (key,))
    elif pattern == "ext_claim":
        cur.execute("SELECT outcome FROM idem_claim(%s, scope => %s)", (key, scope))
        if cur.fetchone()[0] == "claimed":
            cur.execute("INSERT INTO ser_business VALUES (%s, 42)", (key,))
            cur.execute("SELECT idem_complete(%s, '{}'::jsonb, scope => %s)", (key, scope))
    elif pattern == "hand_once":
        cur.execute("INSERT INTO ser_hand_once VALUES (%s) ON CONFLICT DO NOTHING RETURNING 1", (key,))
        if cur.fetchone():
            cur.execute("INSERT INTO ser_business VALUES (%s, 42)", (key,))
    elif pattern == "ext_once":
        cur.execute("SELECT idem_once(%s, %s)", (key, scope))
        if cur.fetchone()[0]:
            cur.execute("INSERT INTO ser_business VALUES (%s, 42)", (key,))


def consumer(dbname, pattern, scope, deliveries, out):
    conn = psycopg.connect(conninfo(dbname=dbname) + " options='-c default_transaction_isolation=serializable'")
    tries_per_delivery, failures, starved, other = [], 0, 0, []
    while True:
        try:
            key = deliveries.get_nowait()
        except queue.Empty:
            break
        for tries in range(1, MAX_TRIES + 1):
            try:
                with conn.transaction():
                    deliver(conn.cursor(), pattern, scope, key)
                break
            except psycopg.errors.SerializationFailure:
                failures += 1
            except psycopg.Error as e:  # anything else is a defect of the pattern: reported, never retried
                other.append(f"{type(e).__name__}: {e}".strip())
                break
        else:
            starved += 1
        tries_per_delivery.append(tries)
    conn.close()
    out.append((tries_per_delivery, failures, starved, other))


def deliveries_of(mode, rng):
    """The round's deliveries: 400 messages, 1 to 4 deliveries each."""
    if mode == "random":
        keys = [uuid.UUID(int=rng.getrandbits(128)).hex for _ in range(MESSAGES)]
        queue_ = [k for k in keys for _ in range(rng.randint(1, 4))]
        rng.shuffle(queue_)
    else:
        base = rng.randrange(10**9)
        keys = [f"orders-0-{base + i:012d}" for i in range(MESSAGES)]
        queue_ = [k for k in keys for _ in range(rng.randint(1, 4))]
    return keys, queue_


def one_round(admin, dbname, pattern, mode, rnd, rng):
    admin.execute("TRUNCATE ser_hand_claim, ser_hand_once, ser_business")
    scope = f"ser-{pattern}-{mode}-{rnd}-{uuid.uuid4().hex[:8]}"
    keys, order = deliveries_of(mode, rng)
    q = queue.Queue()
    for k in order:
        q.put(k)
    out = []
    threads = [threading.Thread(target=consumer, args=(dbname, pattern, scope, q, out)) for _ in range(SESSIONS)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - t0
    tries = [t for o in out for t in o[0]]
    rows = dict(admin.execute("SELECT key, count(*) FROM ser_business GROUP BY key").fetchall())
    duplicated = sum(1 for k in keys if rows.get(k, 0) > 1)
    missing = sum(1 for k in keys if rows.get(k, 0) == 0)
    starved = sum(o[2] for o in out)
    other = [e for o in out for e in o[3]]
    return {
        "pattern": pattern, "mode": mode, "round": rnd, "deliveries": len(order),
        "serialization_failures": sum(o[1] for o in out), "max_tries": max(tries),
        "deliveries_over_3_tries": sum(1 for t in tries if t > 3), "starved": starved,
        # A message with no business row is one whose deliveries all starved (liveness); two rows break exactly once.
        "never_applied": missing, "applied_twice": duplicated, "other_errors": other[:3], "elapsed_s": round(elapsed, 2),
    }


def summarize(rows):
    out = {}
    for r in rows:
        s = out.setdefault((r["pattern"], r["mode"]), {"failures": [], "max_tries": [], "over3": [], "missing": 0, "twice": 0})
        s["failures"].append(r["serialization_failures"])
        s["max_tries"].append(r["max_tries"])
        s["over3"].append(r["deliveries_over_3_tries"])
        s["missing"] += r["never_applied"]
        s["twice"] += r["applied_twice"]
    return out


def rng_range(v):
    return f"{min(v)}" if min(v) == max(v) else f"{min(v)} to {max(v)}"


def report(rows, meta, path_base):
    summary = summarize(rows)
    lines = [
        "# SERIALIZABLE consumers: serialization failures and tries per delivery (issue 29)",
        "",
        f"`benches/run --serializable{' --edition' if meta['extension'].startswith('SQL edition') else ''}"
        f"{' --rounds ' + str(meta['rounds'])}`, {meta['when']}, PostgreSQL {meta['server']},",
        f"extension {meta['extension']}"
        f"{'' if meta['extension'].startswith('SQL edition') else ' (idempotency.so sha256 ' + meta['extension_so_sha256'][:12] + ')'}. {SESSIONS} sessions, {MESSAGES} messages delivered 1 to 4 times each "
        f"(about 1,000 deliveries a round), `default_transaction_isolation = 'serializable'`, a 40001 retried at "
        f"once (at most {MAX_TRIES} tries), one business INSERT into a plain table. Ranges over {meta['rounds']} rounds per row.",
        "",
    ] + ([f"**{meta['warning']}**", ""] if meta.get("warning") else [])
    for mode in ("random", "sequential"):
        lines += [f"## {'Random string keys, random order' if mode == 'random' else 'Sequential keys, deliveries of a message together'}", "",
                  "| pattern | serialization failures per round | most tries one delivery needed | deliveries over 3 tries | messages never applied | messages applied twice |",
                  "|---|---:|---:|---:|---:|---:|"]
        for p, label in PATTERNS.items():
            s = summary.get((p, mode))
            if not s:
                continue
            lines.append(f"| {label} | {rng_range(s['failures'])} | {rng_range(s['max_tries'])} | {rng_range(s['over3'])} | {s['missing']} | {s['twice']} |")
        lines.append("")
        for ext, hand in MATCH.items():
            e, h = summary.get((ext, mode)), summary.get((hand, mode))
            if e and h:
                ratio = sum(e["failures"]) / max(1, sum(h["failures"]))
                lines.append(f"- {PATTERNS[ext].split(',')[0]}: {sum(e['failures'])} failures over the rounds against "
                             f"{sum(h['failures'])} for the hand-written pattern ({ratio:.2f}x; target at most 2x); "
                             f"most tries {max(e['max_tries'])} (target at most 3).")
        lines.append("")
    with open(path_base + ".md", "w") as f:
        f.write("\n".join(lines))
    with open(path_base + ".json", "w") as f:
        json.dump({"meta": meta, "rounds": rows}, f, indent=1)
    return summary


def install_edition():
    """The SQL edition in its own database, installed as benches/run --only edition installs it (a
    non-superuser owner runs the plain script); the consumers then connect there. Its database name."""
    import types
    import workloads
    from runner import Admin
    bench = types.SimpleNamespace(admin=Admin())
    # edition_schema.sql grants its business table to the consumer role of schema.sql.
    bench.admin.q("DO $$ BEGIN CREATE ROLE bench LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    workloads.setup_edition(bench)
    return bench.edition_database


def run(args):
    rounds = args.rounds
    dbname = install_edition() if args.edition else "postgres"
    admin = psycopg.connect(conninfo(dbname=dbname), autocommit=True)
    if not args.edition:
        admin.execute("CREATE EXTENSION IF NOT EXISTS idempotency CASCADE")
    admin.execute(SCHEMA)
    rng = random.Random(args.seed)
    so_before = so_sha256()
    rows = []
    for mode in ("random", "sequential"):
        for rnd in range(rounds):
            for pattern in PATTERNS:
                r = one_round(admin, dbname, pattern, mode, rnd, rng)
                log(f"serializable {mode:10s} {pattern:10s} round {rnd}: {r['serialization_failures']} failures, "
                    f"max tries {r['max_tries']}, {r['elapsed_s']}s" + (f", errors {r['other_errors']}" if r["other_errors"] else ""))
                rows.append(r)
    meta = {
        "when": time.strftime("%Y-%m-%d"), "rounds": rounds, "seed": args.seed,
        "server": admin.execute("SHOW server_version").fetchone()[0],
        "extension": (f"SQL edition {admin.execute('SELECT idempotency.edition_version()').fetchone()[0]}" if args.edition
                      else admin.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]),
        "extension_so_sha256": so_before,
    }
    if so_sha256() != so_before:
        meta["warning"] = "idempotency.so changed on disk during the run"
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", args.name or "serializable")
    summary = report(rows, meta, base)
    log(f"results in {base}.md")
    bad = [r for r in rows if r["other_errors"] or r["applied_twice"] or r["never_applied"] > r["starved"]]
    if bad:
        raise SystemExit(f"defects: {bad[:2]}")
    return summary
