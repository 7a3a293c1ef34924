#!/usr/bin/env python3
"""The end-to-end exactly-once run: producer, consumer group, payment provider, chaos, verification.

Started by tests/e2e/run, which provides the cluster (IDEM_PORT, IDEM_SOCKDIR) and the broker
(E2E_BOOTSTRAP). This file starts the provider, the producer and the consumers, runs the chaos driver for
a bounded time, lets the group drain, checks every invariant and prints the figures. Exit status 1 on
any violation.
"""
import argparse
import collections
import glob
import itertools
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exactly_once import (FREEZE_S, Fleet, kills_so_far, log, process_state, read_events,  # noqa: E402
                          setup_db, verify_ledger)  # shared with tests/brokers

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
PROFILES = {
    # chaos runs for chaos_s, longer (up to chaos_max_s) until min_kills kills happened; the producer
    # spreads its messages over produce_s; an action every gap seconds
    # Fewer than max(1, min_kills) kills, no redelivery or no duplicate suppressed is a violation: such
    # a run did not test what it claims to (chaos_violations).
    "quick": dict(m=5000, parts=6, k=4, produce_s=75, chaos_s=80, chaos_max_s=100, min_kills=4,
                  gap=(2.0, 5.0), drain_s=120),
    "long": dict(m=20000, parts=6, k=4, produce_s=360, chaos_s=360, chaos_max_s=480, min_kills=50,
                 gap=(2.0, 6.0), drain_s=240),
}
# where an armed consumer kills itself (SIGKILL) or freezes itself (SIGSTOP, woken by the driver)
KILL_POINTS = ["in_assign", "after_http", "mid_txn", "after_commit"]
FREEZE_POINTS = ["freeze_after_http", "freeze_before_txn"]


def high_watermarks(bootstrap, topic, parts):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-verify", "enable.auto.commit": False})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(parts)}
    finally:
        c.close()


def stored_offsets(db, group, topic):
    return {p: n for _, p, n, _, _ in
            db.execute("SELECT * FROM idem_offsets(%s, %s)", (group, topic)).fetchall()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", choices=PROFILES, default="quick")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--consumers", type=int)
    ap.add_argument("--chaos-seconds", type=int)
    ap.add_argument("--seed", default=str(int(time.time())))
    ap.add_argument("--generation", choices=["group", "epoch"], default="group")
    args = ap.parse_args()
    cfg = dict(PROFILES[args.profile])
    if args.messages:
        cfg["m"] = args.messages
    if args.consumers:
        cfg["k"] = args.consumers
    if args.chaos_seconds:
        cfg["chaos_s"] = args.chaos_seconds
        cfg["produce_s"] = max(10, args.chaos_seconds - 5)
        cfg["chaos_max_s"] = max(cfg["chaos_max_s"], args.chaos_seconds)
    random.seed(args.seed)
    run = f"r{args.seed}"
    run_dir = os.environ["E2E_RUN_DIR"]
    bootstrap = os.environ["E2E_BOOTSTRAP"]
    dsn = f"host={os.environ['IDEM_SOCKDIR']} port={os.environ['IDEM_PORT']} user=postgres"
    topic, group, dbname = f"payments-{run}", f"billing-{run}", "e2e"
    log(f"profile {args.profile}: {cfg}, seed {args.seed}, generation from {args.generation}")

    setup_db(dsn, dbname)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, cfg["parts"], 1)]).values():
        f.result(30)
    env = dict(os.environ, E2E_TOPIC=topic, E2E_GROUP=group, E2E_DB=dbname,
               E2E_GENERATION=args.generation, PYTHONUNBUFFERED="1")
    provider_port = int(os.environ["E2E_PROVIDER_PORT"])
    children = []
    provider = subprocess.Popen([PY, f"{HERE}/provider.py", str(provider_port), "0.01"],
                                stdout=open(f"{run_dir}/provider.out", "w"), stderr=subprocess.STDOUT)
    children.append(provider)
    fleet = Fleet([PY, f"{HERE}/consumer.py"], env, run_dir)
    try:
        time.sleep(0.5)
        for _ in range(cfg["k"]):
            fleet.spawn()
        produced_file = f"{run_dir}/produced.json"
        producer = subprocess.Popen(
            [PY, f"{HERE}/producer.py", bootstrap, topic, run, str(cfg["m"]), str(cfg["produce_s"]),
             "0.03", produced_file], stdout=open(f"{run_dir}/producer.out", "w"), stderr=subprocess.STDOUT)
        children.append(producer)

        # ---- chaos -------------------------------------------------------------------------
        t0 = time.monotonic()
        next_action = t0 + random.uniform(*cfg["gap"])
        last_report = t0
        points = itertools.cycle(random.sample(KILL_POINTS, len(KILL_POINTS)))  # each in turn
        freeze_points = itertools.cycle(FREEZE_POINTS)
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= cfg["chaos_max_s"] or (elapsed >= cfg["chaos_s"] and
                                                 kills_so_far(run_dir, fleet) >= cfg["min_kills"]):
                break
            fleet.reap()
            now = time.monotonic()
            if now >= next_action:
                next_action = now + random.uniform(*cfg["gap"])
                alive = [c for c in fleet.alive() if c not in fleet.frozen and c not in fleet.freeze_armed
                         and not os.path.exists(f"{run_dir}/arm-{c}")]
                r = random.random()
                if not alive:
                    if len(fleet.procs) < cfg["k"] + 2:
                        fleet.spawn()
                        fleet.count["members added"] += 1
                elif r < 0.40:
                    fleet.kill9(random.choice(alive))
                elif r < 0.70:
                    fleet.arm(random.choice(alive), next(points))
                elif r < 0.78:
                    if not fleet.frozen and not fleet.freeze_armed:
                        fleet.arm(random.choice(alive), next(freeze_points))
                elif r < 0.85 and len(fleet.procs) < cfg["k"] + 2:
                    fleet.spawn()
                    fleet.count["members added"] += 1
                elif r < 0.92 and len(fleet.procs) > max(1, cfg["k"] - 2):
                    fleet.remove(random.choice(alive))
                elif not fleet.frozen and not fleet.freeze_armed:
                    fleet.freeze(random.choice(alive), FREEZE_S)
            if now - last_report > 30:
                last_report = now
                log(f"chaos: {kills_so_far(run_dir, fleet)} kills; {dict(fleet.count)}; "
                    f"{len(fleet.alive())} consumers alive")
            time.sleep(0.1)
        chaos_s = time.monotonic() - t0

        # ---- drain ---------------------------------------------------------------------------
        log("chaos over: back to the base group, waiting for the producer and the drain")
        for path in glob.glob(f"{run_dir}/arm-*"):
            os.unlink(path)
        time.sleep(1)
        for cid in list(fleet.freeze_armed):  # stopped already: thawed as planned; else never will be
            fleet.freeze_armed.discard(cid)
            if fleet.procs[cid].poll() is None and process_state(fleet.procs[cid].pid) == "T":
                fleet.frozen[cid] = time.monotonic() + FREEZE_S
        while len(fleet.procs) > cfg["k"]:
            fleet.remove(max(fleet.procs))
        while time.monotonic() - t0 < chaos_s + 5 or fleet.restart_at or fleet.frozen or fleet.freeze_armed:
            fleet.reap(restart_delay=(0, 0))
            time.sleep(0.1)
        while len(fleet.procs) < cfg["k"]:
            fleet.spawn()
        if producer.wait(300) != 0:
            raise SystemExit("producer failed: see producer.out")
        with open(produced_file) as f:  # the end of each partition, from the producer's delivery reports
            high = {int(p): n for p, n in json.load(f)["ends"].items()}
        broker_high = high_watermarks(bootstrap, topic, cfg["parts"])
        if broker_high != high:
            log(f"note: the broker's high watermarks {broker_high} differ from the delivery reports {high}")
        db = psycopg.connect(dsn + f" dbname={dbname}", autocommit=True)
        deadline = time.monotonic() + cfg["drain_s"]
        last, last_change = None, time.monotonic()
        while time.monotonic() < deadline:
            fleet.reap(restart_delay=(0, 0))
            now_offsets = stored_offsets(db, group, topic)
            if now_offsets == high:
                break
            if now_offsets != last:
                last, last_change = now_offsets, time.monotonic()
            elif time.monotonic() - last_change > 20:
                # tansu 0.6 can leave a partition unassigned until the next membership change (a member
                # that dies between JoinGroup and SyncGroup keeps its share): force one (README.md)
                cid = min(fleet.alive())
                log(f"no progress for 20 s at {now_offsets}: restarting consumer {cid} to force a rebalance")
                fleet.remove(cid)
                fleet.spawn(cid)
                fleet.count["rebalances forced (tansu left partitions unassigned)"] += 1
                last_change = time.monotonic()
            time.sleep(0.5)
        drain = time.monotonic() - t0 - chaos_s
        fleet.stop_all()
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{provider_port}/stats").read())
        violations = verify(db, group, topic, high, produced_file, stats)
        figures(run_dir, fleet, produced_file, stats, db, violations, drain, args.generation, cfg)
    finally:
        fleet.stop_all()
        for p in children:
            if p.poll() is None:
                p.terminate()
                p.wait()
    sys.exit(1 if violations else 0)


def verify(db, group, topic, high, produced_file, stats):
    with open(produced_file) as f:
        produced = dict(json.load(f)["messages"])
    v = verify_ledger(db, produced, stats)
    stored = stored_offsets(db, group, topic)
    for p, h in sorted(high.items()):
        if stored.get(p) != h:
            v.append(f"partition {p}: stored next offset {stored.get(p)}, end of log {h}")
    return v


def chaos_violations(cfg, kills, redelivered, suppressed):
    """A run that did not test what it claims to is a failed run: fewer kills than the profile needs (at
    least one), no record delivered twice, no duplicate suppressed by the ledger claims."""
    v = []
    if kills < max(1, cfg["min_kills"]):
        v.append(f"only {kills} kills (kill -9), the profile needs at least {max(1, cfg['min_kills'])}: "
                 "the run did not test crashes")
    if redelivered == 0:
        v.append("no record was delivered twice: the run did not test redeliveries")
    if suppressed == 0:
        v.append("no duplicate was suppressed by the ledger claims: the run did not test duplicates")
    return v


def figures(run_dir, fleet, produced_file, stats, db, violations, drain, gen_mode, cfg):
    with open(produced_file) as f:
        prod = json.load(f)
    evs = read_events(run_dir)
    seen = collections.Counter()
    deliveries = 0
    for e in evs:
        if e["ev"] == "poll":
            for p, offs in e["offsets"].items():
                deliveries += len(offs)
                seen.update((p, o) for o in offs)
    redelivered = sum(n - 1 for n in seen.values())
    c = collections.Counter()
    for e in evs:
        if e["ev"] == "applied":
            for k, n in e["ledger"].items():
                c["ledger " + k] += n
        elif e["ev"] == "paid":
            for k, n in e["pay"].items():
                c["payment " + k] += n
        elif e["ev"] == "selfkill":
            c["kill -9 at " + e["point"]] += 1
        elif e["ev"] == "selffreeze":
            c["frozen at " + e["point"]] += 1
        elif e["ev"] in ("fenced", "broker_commit_failed"):
            c[e["ev"]] += 1
        elif e["ev"] == "poll_error":
            c["poll_error"] += e["n"]
        elif e["ev"] == "assign":
            c["assignments"] += 1
            for p, off in e["db"].items():
                b = e["broker"].get(p)
                if off >= 0 and b is not None and b >= 0 and off > b:
                    c["seeks where the database was ahead of the broker"] += 1
    gens = {e["gen"] for e in evs if e["ev"] == "assign"}
    kills = fleet.count["kill -9 (external, random moment)"] + sum(
        n for k, n in c.items() if k.startswith("kill -9 at "))
    rows = db.execute("SELECT count(*), count(DISTINCT msg_key) FROM e2e.ledger").fetchone()
    forced = fleet.count["rebalances forced (tansu left partitions unassigned)"]
    (max_attempts,) = db.execute(
        "SELECT max(attempts) FROM idempotency.records WHERE scope = 'payment'").fetchone()
    print("\n==== end-to-end figures ====")
    fig = [
        ("messages", len(prod["messages"])),
        ("records in the log (producer retries included)", prod["records"]),
        ("deliveries (records handed to consumers)", deliveries),
        ("redeliveries (same record delivered again)", redelivered),
        ("kills (kill -9)", kills),
    ]
    fig += sorted((f"  {k}", n) for k, n in list(fleet.count.items()) + list(c.items())
                  if k.startswith("kill -9"))
    fig += [
        (f"rebalances (distinct {'group generations' if gen_mode == 'group' else 'epochs'})", len(gens)),
        ("  assignments", c["assignments"]),
        ("  members added / removed", f"{fleet.count['members added']} / "
                                      f"{fleet.count['members removed (clean leave)'] - forced}"),
        ("  frozen consumers (SIGSTOP past session and lease)",
         fleet.count["frozen past session and lease (zombie)"] + c["frozen at after_http"]
         + c["frozen at before_txn"]),
        ("    at a random moment / after_http / before_txn",
         f"{fleet.count['frozen past session and lease (zombie)']} / {c['frozen at after_http']} / "
         f"{c['frozen at before_txn']}"),
        ("  forced after tansu left partitions unassigned (drain)",
         fleet.count["rebalances forced (tansu left partitions unassigned)"]),
        ("  zombies fenced by idem_record_offset (55006)", c["fenced"]),
        ("  seeks where the database was ahead of the broker",
         c["seeks where the database was ahead of the broker"]),
        ("duplicates suppressed (ledger claims answered completed / repeat)",
         c["ledger completed"] + c["ledger in_batch_repeat"]),
        ("ledger rows / distinct keys", f"{rows[0]} / {rows[1]}"),
        ("payment claims / takeovers of expired leases", f"{c['payment claimed']} / {c['payment takeover']}"),
        ("payment results replayed from the store", c["payment replayed"]),
        ("most claims of one payment key (attempts)", max_attempts),
        ("payment completions / heartbeats fenced (55006, lease lost)", c["payment fenced"]),
        ("payment lease heartbeats", c["payment heartbeats"]),
        ("broker commits failed after the database's (not raised)", c["broker_commit_failed"]),
        ("consumer errors skipped by poll_batch (not fatal)", c["poll_error"]),
        ("provider requests / charges created", f"{stats['stats']['requests']} / {stats['stats']['created']}"),
        ("provider duplicates absorbed by its Idempotency-Key", stats["stats"]["replayed"]),
        ("drain after chaos (s)", f"{drain:.0f}"),
    ]
    violations += chaos_violations(cfg, kills, redelivered, c["ledger completed"] + c["ledger in_batch_repeat"])
    for k, n in fig:
        print(f"{k:<62} {n}")
    for x in violations:
        print(f"VIOLATION: {x}")
    print(f"violations: {len(violations)}")


if __name__ == "__main__":
    main()
