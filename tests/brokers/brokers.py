#!/usr/bin/env python3
"""The exactly-once runs against RabbitMQ and NATS JetStream: cluster, broker, provider, producer, K
consumers under kill -9, drain, verification, figures. Started by tests/brokers/run (see README.md).

Everything runs on 127.0.0.1, on the range "brokers" of tests/ports:
    +0 PostgreSQL   +1 RabbitMQ AMQP   +2 Erlang distribution   +3 epmd   +4 NATS   +5 payment provider
Each broker is a plain process in a private directory under RUN_DIR (never the Debian system service),
stopped at the end of its run, also on failure. Exit status 1 when a run found a violation or failed.
"""
import argparse
import asyncio
import collections
import glob
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)
from exactly_once import (FREEZE_S, Fleet, kills_so_far, log, process_state, read_events,  # noqa: E402
                          setup_db, verify_ledger)
from pgtools import Cluster, PrivateTree, copy_ext_files, ports  # noqa: E402

PY = sys.executable
PROFILES = {
    # per broker: M messages published over produce_s (3% of them twice), K consumers, chaos for
    # chaos_s (longer, up to chaos_max_s, until min_kills kills happened), an action every gap seconds.
    # Fewer than min_kills kills by chaos_max_s is a violation (see chaos_violations).
    "quick": dict(m=2000, k=4, produce_s=35, chaos_s=40, chaos_max_s=60, min_kills=4, gap=(1.5, 3.5),
                  drain_s=90),
    "long": dict(m=12000, k=4, produce_s=200, chaos_s=210, chaos_max_s=300, min_kills=50, gap=(1.5, 4.0),
                 drain_s=180),
}
KILL_POINTS = ["after_http", "mid_txn", "after_commit"]
FREEZE_POINTS = ["freeze_after_commit", "freeze_after_http"]
DUP_P = 0.03
NATS_ACK_WAIT_S = 4    # short, so that the deliveries of killed and frozen consumers come back quickly
AMQP_HEARTBEAT_S = 4   # RabbitMQ closes a frozen consumer's connection after two missed heartbeats
QUIET_S = 3            # the drain ends when nothing was logged for this long (and all is applied)


def wait_port(port, proc, what, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} not listening on {port} after {timeout} s")


def reserve_ports(first, last, path="/proc/sys/net/ipv4/ip_local_reserved_ports"):
    """Keeps the kernel from handing our brokers' ports out as the local port of an outgoing connection
    (they lie in its ephemeral range, 32768-60999): a CI run once saw nats-server fail with "address
    already in use" because a connection of the run held 54404. Added to the reserved list, never
    narrowed; skipped where the file is not writable (not root, a container)."""
    try:
        with open(path) as f:
            current = f.read().strip()
        with open(path, "w") as f:
            f.write(",".join(x for x in (current, f"{first}-{last}") if x))
    except OSError:
        pass


def stop_group(proc, what, timeout=30):
    """SIGTERM to the process group we started `proc` in (start_new_session), SIGKILL after timeout."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log(f"{what} did not stop in {timeout} s: SIGKILL")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class RabbitMQ:
    """rabbitmq-server of Debian as a plain process: own node name, HOME (Erlang cookie), Mnesia and log
    directories, config and plugin files; AMQP, distribution and epmd ports of our range, on loopback."""

    name = "rabbitmq"

    def __init__(self, base, run_dir):
        self.amqp, self.dist, self.epmd_port = base + 1, base + 2, base + 3
        self.dir = f"{run_dir}/server"
        self.server = self.epmd = None
        self.queue = None

    def env(self):
        d = self.dir
        return dict(os.environ, HOME=f"{d}/home", ERL_EPMD_PORT=str(self.epmd_port), ERL_EPMD_ADDRESS="127.0.0.1",
                    RABBITMQ_CONF_ENV_FILE=f"{d}/rabbitmq-env.conf", RABBITMQ_NODENAME="idem-brokers@localhost",
                    RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.amqp),
                    RABBITMQ_DIST_PORT=str(self.dist), RABBITMQ_CONFIG_FILE=f"{d}/rabbitmq.conf",
                    RABBITMQ_ENABLED_PLUGINS_FILE=f"{d}/enabled_plugins", RABBITMQ_MNESIA_BASE=f"{d}/mnesia",
                    RABBITMQ_LOG_BASE=f"{d}/log", RABBITMQ_PID_FILE=f"{d}/rabbit.pid",
                    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")

    def start(self):
        d = self.dir
        for sub in ("home", "mnesia", "log"):
            os.makedirs(f"{d}/{sub}", exist_ok=True)
        with open(f"{d}/rabbitmq.conf", "w") as f:
            f.write(f"listeners.tcp.default = 127.0.0.1:{self.amqp}\nlog.console = false\n"
                    "log.file.level = info\n")
        with open(f"{d}/enabled_plugins", "w") as f:
            f.write("[].\n")
        open(f"{d}/rabbitmq-env.conf", "w").close()  # instead of /etc/rabbitmq/rabbitmq-env.conf
        env = self.env()
        self.epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"], env=env,
                                     stdout=open(f"{d}/epmd.log", "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_port(self.epmd_port, self.epmd, "epmd", 10)
        self.server = subprocess.Popen(["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=env, cwd=d,
                                       stdout=open(f"{d}/server.out", "w"), stderr=subprocess.STDOUT,
                                       start_new_session=True)
        wait_port(self.amqp, self.server, f"rabbitmq-server (see {d}/server.out, {d}/log)")

    def stop(self):
        stop_group(self.server, "rabbitmq-server")
        stop_group(self.epmd, "epmd", 5)

    def _channel(self):
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=self.amqp,
                                                                 connection_attempts=10, retry_delay=1))
        return conn, conn.channel()

    def setup(self, run):
        self.queue = f"payments-{run}"
        conn, ch = self._channel()
        ch.queue_declare(self.queue, durable=True)
        conn.close()
        return {"BROKERS_AMQP_PORT": str(self.amqp), "BROKERS_QUEUE": self.queue,
                "BROKERS_AMQP_HEARTBEAT": str(AMQP_HEARTBEAT_S)}

    def pending(self):
        """Messages ready in the queue (the unacknowledged ones AMQP does not tell)."""
        conn, ch = self._channel()
        n = ch.queue_declare(self.queue, passive=True).method.message_count
        conn.close()
        return n

    def describe(self):
        return (f"rabbitmq-server {deb_version('rabbitmq-server')}: classic durable queue, persistent messages, "
                f"publisher confirms, manual acks (prefetch = batch), heartbeat {AMQP_HEARTBEAT_S} s; "
                f"idempotency_client {client_version()} (sync): lease per payment, process_batch per batch")


class Nats:
    """nats-server of Debian with JetStream (file storage in a private directory), client port of our range
    on loopback, no monitoring port, no cluster port."""

    name = "nats"

    def __init__(self, base, run_dir):
        self.port = base + 4
        self.dir = f"{run_dir}/server"
        self.server = None
        self.stream = self.durable = self.subject = None

    def start(self):
        os.makedirs(f"{self.dir}/js", exist_ok=True)
        self.server = subprocess.Popen(
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", f"{self.dir}/js",
             "-n", "idem-brokers", "-l", f"{self.dir}/nats.log"],
            stdout=open(f"{self.dir}/server.out", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, self.server, f"nats-server (see {self.dir}/nats.log)")

    def stop(self):
        stop_group(self.server, "nats-server")

    async def _js(self, fn):
        import nats

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}", name="driver")
        try:
            return await fn(nc.jetstream())
        finally:
            await nc.close()

    def setup(self, run):
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

        self.stream, self.durable, self.subject = f"PAYMENTS_{run}", "billing", f"payments.{run}"

        async def fn(js):
            await js.add_stream(StreamConfig(name=self.stream, subjects=[self.subject], storage=StorageType.FILE))
            await js.add_consumer(self.stream, ConsumerConfig(
                durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=NATS_ACK_WAIT_S,
                deliver_policy=DeliverPolicy.ALL, max_deliver=-1, max_ack_pending=2000))

        asyncio.run(self._js(fn))
        return {"BROKERS_NATS_PORT": str(self.port), "BROKERS_STREAM": self.stream,
                "BROKERS_DURABLE": self.durable, "BROKERS_SUBJECT": self.subject}

    def consumer_info(self):
        return asyncio.run(self._js(lambda js: js.consumer_info(self.stream, self.durable)))

    def pending(self):
        """Messages not yet delivered plus messages delivered and not acknowledged."""
        info = self.consumer_info()
        return info.num_pending + info.num_ack_pending

    def describe(self):
        return (f"nats-server {deb_version('nats-server')}: JetStream file stream, durable pull consumer, "
                f"explicit acks, AckWait {NATS_ACK_WAIT_S} s (+WPI while a batch works); "
                f"idempotency_client {client_version()} (asyncio): aio.lease per payment, @aio.idempotent per "
                f"message in aio.run_transaction per batch")


def client_version():
    import idempotency_client

    return idempotency_client.__version__


def deb_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
    return r.stdout.strip() or "?"


def check_crashes(fleet, run_dir):
    crashes = sum(n for k, n in fleet.count.items() if k.startswith("exit_"))
    if crashes > 10:
        raise RuntimeError(f"{crashes} consumers crashed: see {run_dir}/c*.out")


def logs_size(run_dir):
    return sum(os.path.getsize(p) for p in glob.glob(f"{run_dir}/c*.jsonl"))


def run_broker(broker, cfg, args, dsn, run_dir, provider_port):
    """One broker's run; returns the list of violations (raises on a harness failure)."""
    seed = f"{args.seed}-{broker.name}"
    random.seed(seed)
    run = "r" + re.sub(r"\W", "", seed)  # names the queue, stream and keys of this run
    dbname = f"brokers_{broker.name}"
    log(f"{broker.name}: profile {args.profile} {cfg}, seed {seed}")
    setup_db(dsn, dbname)
    t_start = time.monotonic()
    broker.start()
    log(f"{broker.name}: broker up in {time.monotonic() - t_start:.1f} s")
    env = dict(os.environ, BROKERS_RUN_DIR=run_dir, BROKERS_DSN=f"{dsn} dbname={dbname}", BROKERS_PROVIDER_PORT=str(provider_port),
               PYTHONUNBUFFERED="1", **broker.setup(run))
    children = []
    provider = subprocess.Popen([PY, f"{TESTS}/e2e/provider.py", str(provider_port), "0.01"],
                                stdout=open(f"{run_dir}/provider.out", "w"), stderr=subprocess.STDOUT)
    children.append(provider)
    fleet = Fleet([PY, f"{HERE}/consumer.py", broker.name], env, run_dir, expected_exits=(-signal.SIGKILL, 4))
    db = None
    try:
        wait_port(provider_port, provider, "provider", 10)
        for _ in range(cfg["k"]):
            fleet.spawn()
        produced_file = f"{run_dir}/produced.json"
        producer = subprocess.Popen(
            [PY, f"{HERE}/producer.py", broker.name, run, str(cfg["m"]), str(cfg["produce_s"]), str(DUP_P),
             produced_file], env=env, stdout=open(f"{run_dir}/producer.out", "w"), stderr=subprocess.STDOUT)
        children.append(producer)

        # ---- chaos -------------------------------------------------------------------------------
        t0 = time.monotonic()
        next_action = t0 + random.uniform(*cfg["gap"])
        last_report = t0
        points = itertools.cycle(random.sample(KILL_POINTS, len(KILL_POINTS)))
        freeze_points = itertools.cycle(FREEZE_POINTS)
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= cfg["chaos_max_s"] or (elapsed >= cfg["chaos_s"] and
                                                 kills_so_far(run_dir, fleet) >= cfg["min_kills"]):
                break
            if producer.poll() not in (None, 0):
                raise RuntimeError(f"producer failed: see {run_dir}/producer.out")
            fleet.reap()
            check_crashes(fleet, run_dir)
            now = time.monotonic()
            if now >= next_action:
                next_action = now + random.uniform(*cfg["gap"])
                alive = [c for c in fleet.alive() if c not in fleet.frozen and c not in fleet.freeze_armed
                         and not os.path.exists(f"{run_dir}/arm-{c}")]
                r = random.random()
                if not alive:
                    pass
                elif r < 0.45:
                    fleet.kill9(random.choice(alive))
                elif r < 0.75:
                    fleet.arm(random.choice(alive), next(points))
                elif r < 0.85:
                    if not fleet.frozen and not fleet.freeze_armed:
                        fleet.arm(random.choice(alive), next(freeze_points))
                elif r < 0.90 and len(fleet.procs) < cfg["k"] + 2:
                    fleet.spawn()
                    fleet.count["members added"] += 1
                elif r < 0.95 and len(fleet.procs) > max(1, cfg["k"] - 2):
                    fleet.remove(random.choice(alive))
                elif not fleet.frozen and not fleet.freeze_armed:
                    fleet.freeze(random.choice(alive), FREEZE_S)
            if now - last_report > 20:
                last_report = now
                log(f"{broker.name}: chaos {elapsed:.0f} s, {kills_so_far(run_dir, fleet)} kills, "
                    f"{len(fleet.alive())} consumers alive")
            time.sleep(0.1)
        chaos_s = time.monotonic() - t0

        # ---- drain -------------------------------------------------------------------------------
        log(f"{broker.name}: chaos over after {chaos_s:.0f} s: back to {cfg['k']} consumers, draining")
        for path in glob.glob(f"{run_dir}/arm-*"):
            os.unlink(path)
        time.sleep(1)
        for cid in list(fleet.freeze_armed):  # stopped already: thawed as planned; else never will be
            fleet.freeze_armed.discard(cid)
            if fleet.procs[cid].poll() is None and process_state(fleet.procs[cid].pid) == "T":
                fleet.frozen[cid] = time.monotonic() + FREEZE_S
        while len(fleet.procs) > cfg["k"]:
            fleet.remove(max(fleet.procs))
        while fleet.restart_at or fleet.frozen or fleet.freeze_armed:
            fleet.reap(restart_delay=(0, 0))
            time.sleep(0.1)
        while len(fleet.procs) < cfg["k"]:
            fleet.spawn()
        if producer.wait(300) != 0:
            raise RuntimeError(f"producer failed: see {run_dir}/producer.out")
        with open(produced_file) as f:
            prod = json.load(f)
        produced = dict(prod["messages"])
        db = psycopg.connect(dsn + f" dbname={dbname}", autocommit=True)
        t_drain = time.monotonic()
        deadline = t_drain + cfg["drain_s"]
        size, quiet_since = -1, time.monotonic()
        while True:
            fleet.reap(restart_delay=(0, 0))
            check_crashes(fleet, run_dir)
            (applied,) = db.execute("SELECT count(DISTINCT msg_key) FROM e2e.ledger").fetchone()
            s = logs_size(run_dir)
            if s != size:
                size, quiet_since = s, time.monotonic()
            if applied >= len(produced) and time.monotonic() - quiet_since >= QUIET_S and broker.pending() == 0:
                break
            if time.monotonic() > deadline:
                log(f"{broker.name}: drain gave up after {cfg['drain_s']} s: {applied} of {len(produced)} "
                    f"applied, {broker.pending()} pending in the broker")
                break
            time.sleep(0.5)
        drain_s = time.monotonic() - t_drain
        fleet.stop_all()
        left = broker.pending()  # after the consumers left: what nobody acknowledged
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{provider_port}/stats").read())
        violations = verify_ledger(db, produced, stats)
        if left:
            violations.append(f"{left} messages left unacknowledged in the broker after the drain")
        exits = {k: n for k, n in fleet.count.items() if k.startswith("exit_")}
        if exits:
            violations.append(f"consumers that crashed (exit status: count) {exits}: see {run_dir}/c*.out")
        t = tally(run_dir, fleet)
        violations += chaos_violations(cfg, t)
        figures(broker, t, fleet, prod, stats, db, violations, chaos_s, drain_s, left)
        return violations
    finally:
        fleet.stop_all()
        for p in children:
            if p.poll() is None:
                p.terminate()
                p.wait()
        if db is not None:
            db.close()
        broker.stop()


def tally(run_dir, fleet):
    """The run's counters from the consumers' event logs and the chaos driver: a Counter with deliveries,
    redelivered, kills (external + self-kills at chosen points), "kill -9 at <point>", "ledger <outcome>",
    "payment <counter>", suppressed (ledger claims that met a completed key or a repeat in the batch),
    distinct keys delivered."""
    evs = read_events(run_dir)
    c = collections.Counter()
    seen = collections.Counter()
    for e in evs:
        ev = e["ev"]
        if ev == "batch":
            c["deliveries"] += e["n"]
            c["redelivered"] += e["redelivered"]
            seen.update(e["keys"])
        elif ev == "applied":
            for k, n in e["ledger"].items():
                c["ledger " + k] += n
        elif ev == "paid":
            for k, n in e["pay"].items():
                c["payment " + k] += n
        elif ev == "selfkill":
            c["kill -9 at " + e["point"]] += 1
        elif ev == "selffreeze":
            c["frozen at " + e["point"]] += 1
        elif ev in ("connection_lost", "start", "lease_lost"):
            c[ev] += 1
    c["kill -9 external"] = fleet.count["kill -9 (external, random moment)"]
    c["kills"] = c["kill -9 external"] + sum(n for k, n in c.items() if k.startswith("kill -9 at "))
    c["suppressed"] = c["ledger completed"] + c["ledger in_batch_repeat"]
    c["distinct keys delivered"] = len(seen)
    return c


def chaos_violations(cfg, t):
    """A run that did not test what it claims to is a failed run: no kill (or fewer than the profile's
    min_kills), no redelivery by the broker, no duplicate suppressed by the ledger claims."""
    v = []
    if t["kills"] < max(1, cfg["min_kills"]):
        v.append(f"only {t['kills']} kills (kill -9), the profile needs at least {max(1, cfg['min_kills'])}: "
                 "the run did not test crashes")
    if t["redelivered"] == 0:
        v.append("no delivery was flagged as a redelivery by the broker: the run did not test redeliveries")
    if t["suppressed"] == 0:
        v.append("no duplicate was suppressed by the ledger claims: the run did not test duplicates")
    return v


def figures(broker, c, fleet, prod, stats, db, violations, chaos_s, drain_s, left):
    ext, kills = c["kill -9 external"], c["kills"]
    rows = db.execute("SELECT count(*), count(DISTINCT msg_key) FROM e2e.ledger").fetchone()
    (max_attempts,) = db.execute("SELECT max(attempts) FROM idempotency.records WHERE scope = 'payment'").fetchone()
    frozen_rnd = fleet.count["frozen past session and lease (zombie)"]
    print(f"\n==== {broker.name}: {broker.describe()} ====")
    fig = [
        ("messages", len(prod["messages"])),
        ("records published (producer retries included)", prod["records"]),
        ("deliveries (messages handed to consumers)", c["deliveries"]),
        ("redeliveries flagged by the broker", c["redelivered"]),
        ("deliveries of a key delivered before (redeliveries + retries)",
         c["deliveries"] - c["distinct keys delivered"]),
        ("kills (kill -9)", kills),
        ("  at a random moment", ext),
    ]
    fig += sorted((f"  at {k[len('kill -9 at '):]}", n) for k, n in c.items() if k.startswith("kill -9 at "))
    fig += [
        ("consumer processes started", c["start"]),
        ("  members added / removed", f"{fleet.count['members added']} / "
                                      f"{fleet.count['members removed (clean leave)']}"),
        ("frozen consumers (SIGSTOP 14 s) random / after_http / after_commit",
         f"{frozen_rnd} / {c['frozen at after_http']} / {c['frozen at after_commit']}"),
        ("  woken to a connection the broker had closed", c["connection_lost"]),
        ("duplicates suppressed (ledger claims answered completed / repeat)", c["suppressed"]),
        ("ledger rows / distinct keys", f"{rows[0]} / {rows[1]}"),
        ("payment claims / takeovers of expired leases", f"{c['payment claimed']} / {c['payment takeover']}"),
        ("payment results replayed from the store", c["payment replayed"]),
        ("most claims of one payment key (attempts)", max_attempts),
        # counted from the consumers' lease_lost events: a RabbitMQ zombie exits (status 4) right after its
        # LeaseLost, before its batch's "paid" event
        ("payment completions / heartbeats fenced (55006, LeaseLost)", c["lease_lost"]),
        ("provider requests / charges created", f"{stats['stats']['requests']} / {stats['stats']['created']}"),
        ("provider duplicates absorbed by its Idempotency-Key", stats["stats"]["replayed"]),
        ("left unacknowledged in the broker at the end", left),
        ("chaos / drain (s)", f"{chaos_s:.0f} / {drain_s:.0f}"),
    ]
    for k, n in fig:
        print(f"{k:<66} {n}")
    for x in violations:
        print(f"VIOLATION: {x}")
    print(f"violations: {len(violations)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", choices=PROFILES, default="quick")
    ap.add_argument("--broker", choices=["rabbitmq", "nats", "all"], default="all")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--consumers", type=int)
    ap.add_argument("--chaos-seconds", type=int)
    ap.add_argument("--seed", default=str(int(time.time())))
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
    r = ports("brokers")
    base = r.start
    reserve_ports(r.start, r.stop - 1)
    root = f"/tmp/idem-brokers-{base}"
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    # SIGTERM / SIGINT: unwind through the finally blocks, which stop every server we started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # The cluster runs from a private copy of the installation with a snapshot of the extension's files:
    # a scripts/build that reinstalls the extension during the run cannot swap the library under it.
    tree = PrivateTree(f"{root}/pgtree")
    tree.build()
    tree.install(copy_ext_files(f"{root}/ext-staged"))
    if not (tree.lib / "idempotency.so").exists():
        raise SystemExit("no idempotency.so installed: run scripts/build")
    cluster = Cluster(base, ["max_locks_per_transaction = 256"], bindir=tree.bin)  # /tmp/idem-{data,sock}-PORT
    names = ["rabbitmq", "nats"] if args.broker == "all" else [args.broker]
    passed, failed = [], []
    t0 = time.monotonic()
    try:
        cluster.init()
        cluster.start()
        dsn = f"host={cluster.sockdir} port={cluster.port} user=postgres"
        for name in names:
            run_dir = f"{root}/{name}"
            os.makedirs(run_dir)
            broker = (RabbitMQ if name == "rabbitmq" else Nats)(base, run_dir)
            t = time.monotonic()
            try:
                violations = run_broker(broker, cfg, args, dsn, run_dir, base + 5)
            except Exception as e:  # a harness or broker failure: this run failed, the next one still runs
                traceback.print_exc()
                log(f"{name}: run failed: {e!r}")
                violations = [repr(e)]
            (failed if violations else passed).append(name)
            log(f"{name}: {'passed' if not violations else 'FAILED'} in {time.monotonic() - t:.0f} s; "
                f"logs in {run_dir}")
    finally:
        cluster.stop()
    log(f"all runs in {time.monotonic() - t0:.0f} s")
    print(f"brokers: {len(passed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
