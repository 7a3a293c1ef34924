"""Hostile roles against a live cluster: each test plays one attacker of issue 20 and checks that it gets
exactly what docs/security.md says, and no more.

* A database owner (not a superuser) plants lookalike operators and functions in `public`, whose bodies
  make it a superuser when a superuser runs them and log every call: before CREATE EXTENSION (bound into
  the extension's views?), and before the worker's rounds, with `ALTER DATABASE ... SET search_path`
  putting `public` first.
* A consumer with a legal DateStyle, TimeZone and default_tablespace of its own writes keys (and makes the
  partitions on demand); every other session must see them as duplicates, and no row may lie outside its
  partition's bounds.
* A consumer tries the limits: policy settings, year-long leases, oversized arrays and documents.
* A `pg_monitor` member reads counts, never keys, tokens or stored errors.
"""
import pathlib
import shutil
import subprocess
import tempfile
import time

import psycopg
import pytest

import pgtools
from conftest import WORKER_DB

OWNER, CONSUMER, MONITOR = "hostile_owner", "hostile_consumer", "hostile_monitor"

# Lookalikes a database owner can create in `public`. The left operand of each operator is what the
# extension's own statements compared before 0.6.0 (oid = regclass in the worker and the views,
# oid = regnamespace in the worker, name LIKE in the worker, bigint / double precision in the stats
# view); the functions shadow ones that scripts called unqualified.
TRAPS = """
CREATE TABLE public.trap_log (trap text, who name, superuser boolean);
GRANT INSERT, SELECT ON public.trap_log TO PUBLIC;
CREATE FUNCTION public.trap_fired(trap text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.trap_log VALUES (trap, current_user, current_setting('is_superuser')::boolean);
    IF current_setting('is_superuser')::boolean THEN
        EXECUTE 'ALTER ROLE hostile_owner SUPERUSER';
    END IF;
END $$;
CREATE FUNCTION public.trap_oid_regclass(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.trap_fired('=(oid, regclass)'); RETURN $1 OPERATOR(pg_catalog.=) $2::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = public.trap_oid_regclass);
CREATE FUNCTION public.trap_oid_regnamespace(oid, regnamespace) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.trap_fired('=(oid, regnamespace)'); RETURN $1 OPERATOR(pg_catalog.=) $2::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regnamespace, FUNCTION = public.trap_oid_regnamespace);
CREATE FUNCTION public.trap_like(name, name) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.trap_fired('~~(name, name)'); RETURN $1::text OPERATOR(pg_catalog.~~) $2::text; END $$;
CREATE OPERATOR public.~~ (LEFTARG = name, RIGHTARG = name, FUNCTION = public.trap_like);
CREATE FUNCTION public.trap_div(bigint, double precision) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN PERFORM public.trap_fired('/(bigint, double precision)'); RETURN $1::float8 OPERATOR(pg_catalog./) $2; END $$;
CREATE OPERATOR public./ (LEFTARG = bigint, RIGHTARG = double precision, FUNCTION = public.trap_div);
CREATE FUNCTION public.format(text, regprocedure) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.trap_fired('format(text, regprocedure)'); RETURN pg_catalog.format($1, $2); END $$;
"""


def _owner_db(cluster, name):
    """A database owned by the non-superuser OWNER, who holds CREATE on its public schema (PostgreSQL
    15's default for a database owner)."""
    with cluster.connect() as c:
        for role, extra in ((OWNER, ""), (CONSUMER, " IN ROLE idempotency_consumer"),
                            (MONITOR, " IN ROLE pg_monitor")):
            if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                if "idempotency_consumer" in extra and not c.execute(
                        "SELECT 1 FROM pg_roles WHERE rolname = 'idempotency_consumer'").fetchone():
                    c.execute("CREATE ROLE idempotency_consumer NOLOGIN")
                c.execute(f"CREATE ROLE {role} LOGIN{extra}")
        c.execute(f"ALTER ROLE {OWNER} NOSUPERUSER")
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}" OWNER {OWNER}')


def _fired(cluster, db):
    with cluster.connect(db) as c:
        log = c.execute("SELECT trap, who, superuser FROM public.trap_log").fetchall()
        su = c.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = %s", (OWNER,)).fetchone()[0]
    return log, su


def _armed(cluster, db):
    """The traps do fire when the owner's own unqualified statements hit them (so an empty log means
    something); the log is emptied afterwards."""
    with cluster.connect(db, user=OWNER) as c:
        c.execute("SELECT 1::oid = 'pg_class'::regclass, 'a'::name LIKE 'a'::name, 1::bigint / 2::float8")
        n = c.execute("SELECT count(DISTINCT trap) FROM public.trap_log").fetchone()[0]
        c.execute("DELETE FROM public.trap_log")
    assert n == 3, f"the traps are not armed: {n} of 3 fired for the owner's own statements"


def _bound(c):
    """Objects of the database that depend on an operator or function in public (other than the
    lookalikes' own operators on their functions)."""
    return c.execute("""
            SELECT pg_catalog.count(*) FROM pg_catalog.pg_depend d
             WHERE (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_operator'::pg_catalog.regclass::oid
                    AND d.refobjid IN (SELECT o.oid FROM pg_catalog.pg_operator o
                                        WHERE o.oprnamespace OPERATOR(pg_catalog.=) 'public'::pg_catalog.regnamespace::oid))
                OR (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass::oid
                    AND d.refobjid IN (SELECT p.oid FROM pg_catalog.pg_proc p
                                        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'public'::pg_catalog.regnamespace::oid)
                    AND d.classid OPERATOR(pg_catalog.<>) 'pg_catalog.pg_operator'::pg_catalog.regclass::oid)
        """).fetchone()[0]


def _use_everything(cluster, db):
    """The consumer API, the admin's reads and a maintenance round, as the roles that run them."""
    with cluster.connect(db) as c:
        c.execute(f"GRANT idempotency_consumer TO {CONSUMER}")
    with cluster.connect(db, user=CONSUMER) as c:
        c.execute("BEGIN")
        c.execute("SELECT * FROM idem_claim('k1', scope => 's')")
        c.execute("""SELECT idem_complete('k1', '{"ok": 1}', scope => 's')""")
        c.execute("COMMIT")
        c.execute("SELECT idem_once('k2', scope => 's')")
        c.execute("SELECT * FROM idem_once_batch(ARRAY['b1', 'b2'], scope => 's')")
        c.execute("SELECT * FROM idem_status('k1', scope => 's')")
        c.execute("SELECT idem_record_offset('g', 't', 0, 10, generation => 1)")
    with cluster.connect(db) as c:
        for sql in ("SELECT * FROM idempotency.stats", "SELECT * FROM idempotency.partitions",
                    "SELECT * FROM idem_metrics()", "SELECT * FROM idem_stats()",
                    "SELECT * FROM idempotency.in_flight", "SELECT * FROM idem_maintenance()"):
            c.execute(sql).fetchall()


def test_owner_planted_before_create_extension(cluster):
    db = "hostile_install"
    _owner_db(cluster, db)
    with cluster.connect(db, user=OWNER) as c:
        c.execute(TRAPS)
    _armed(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        bound = _bound(c)
    assert bound == 0, f"{bound} objects of the extension depend on the owner's lookalikes in public"
    _use_everything(cluster, db)
    log, su = _fired(cluster, db)
    assert log == [], f"the owner's lookalikes ran inside the extension: {log}"
    assert su is False, "the database owner became a superuser"


@pytest.mark.native_only("the background worker")
def test_owner_steers_the_worker(cluster):
    """The worker connects as the bootstrap superuser; the database's owner controls the database's
    search_path, DateStyle and TimeZone, and what its public schema holds."""
    db = WORKER_DB
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute("SELECT FROM idem_maintenance()")
        rounds = c.execute("SELECT coalesce(pg_catalog.max(rounds), 0) FROM idempotency.maintenance_state()").fetchone()[0]
    with cluster.connect(db, user=OWNER) as c:
        c.execute(TRAPS)
        c.execute(f"ALTER DATABASE {db} SET search_path = public, pg_catalog")
        c.execute(f"ALTER DATABASE {db} SET datestyle = 'SQL, DMY'")
        c.execute(f"ALTER DATABASE {db} SET timezone = 'NZST+12'")
        c.execute(f"ALTER DATABASE {db} SET default_tablespace = ''")
    _armed(cluster, db)
    # Three more rounds of the worker (one a second), each of which ran its checks and a round.
    deadline = time.monotonic() + 60
    now = rounds
    while now < rounds + 3 and time.monotonic() < deadline:
        time.sleep(0.5)
        with cluster.connect(db) as c:
            now = c.execute("SELECT coalesce(pg_catalog.max(rounds), 0) FROM idempotency.maintenance_state()").fetchone()[0]
    assert now >= rounds + 3, f"the worker ran {now - rounds} rounds in 60 s; log: {cluster.log_tail()}"
    log, su = _fired(cluster, db)
    assert log == [], f"the worker ran the owner's lookalikes: {log}"
    assert su is False, "the database owner became a superuser through the worker"


def _rows_outside_bounds(c):
    """Rows whose created_at lies outside their partition's bounds, read in a session of ISO, UTC settings
    from the bound's text (the check does not trust the extension's own reading of it)."""
    c.execute("SET timezone = 'UTC'")
    c.execute("SET datestyle = 'ISO, YMD'")
    return c.execute("""
        SELECT pg_catalog.count(*)
          FROM idempotency.records r
          JOIN pg_catalog.pg_class p ON p.oid = r.tableoid
          CROSS JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(p.relpartbound, p.oid),
                                                     'FROM \\(''([^'']*)''\\) TO \\(''([^'']*)''\\)') b
         WHERE NOT (r.created_at >= b[1]::timestamptz AND r.created_at < b[2]::timestamptz)""").fetchone()[0]


@pytest.mark.parametrize("settings", [
    ("SQL, DMY", "NZST+12"),
    ("Postgres, MDY", "Asia/Shanghai"),
    ("German", "America/St_Johns"),
])
def test_session_settings_do_not_split_keys(cluster, settings):
    """A consumer's legal DateStyle and TimeZone, on a database without partitions yet (the consumer's
    first claim makes them): every key it writes is a duplicate for a session of other settings."""
    datestyle, timezone = settings
    db = "hostile_settings"
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute(f"GRANT idempotency_consumer TO {CONSUMER}")
    with cluster.connect(db, user=CONSUMER) as odd:
        odd.execute(f"SET datestyle = '{datestyle}'")
        odd.execute(f"SET timezone = '{timezone}'")
        assert odd.execute("SELECT idem_once('once-key')").fetchone()[0] is True
        odd.execute("BEGIN")
        assert odd.execute("SELECT outcome FROM idem_claim('claim-key')").fetchone()[0] == "claimed"
        odd.execute("""SELECT idem_complete('claim-key', '{"done": 1}')""")
        odd.execute("COMMIT")
        assert odd.execute("SELECT pg_catalog.count(*) FROM idem_once_batch(ARRAY['b1', 'b2'])").fetchone()[0] == 2
    with cluster.connect(db, user=CONSUMER) as plain:
        assert plain.execute("SELECT idem_once('once-key')").fetchone()[0] is False, \
            f"a key written under {settings} was new again for another session"
        assert plain.execute("SELECT outcome FROM idem_claim('claim-key')").fetchone()[0] == "completed"
        assert plain.execute("SELECT pg_catalog.count(*) FROM idem_once_batch(ARRAY['b1', 'b2'])").fetchone()[0] == 0
    with cluster.connect(db) as c:
        assert _rows_outside_bounds(c) == 0, "rows lie outside their partition's bounds"
        # The partitions' ranges read the same under any zone and abbreviation.
        c.execute(f"SET timezone = '{timezone}'")
        c.execute(f"SET datestyle = '{datestyle}'")
        odd = c.execute("SELECT pg_catalog.array_agg(extract(epoch FROM range_from) ORDER BY partition::oid)"
                        " FROM idempotency.partitions").fetchone()[0]
        c.execute("SET timezone = 'UTC'")
        utc = c.execute("SELECT pg_catalog.array_agg(extract(epoch FROM range_from) ORDER BY partition::oid)"
                        " FROM idempotency.partitions").fetchone()[0]
        assert odd == utc, f"idempotency.partitions moves with the reader's settings: {odd} vs {utc}"


def test_consumer_tablespace_does_not_place_partitions(cluster):
    """A consumer with CREATE on a tablespace of its own makes the partitions on demand: they go where the
    record table's go, not to the consumer's default_tablespace."""
    db = "hostile_tablespace"
    _owner_db(cluster, db)
    location = pathlib.Path(tempfile.mkdtemp(prefix="idem-hostile-ts-", dir="/tmp"))
    shutil.chown(location, "postgres", "postgres")
    with cluster.connect() as c:
        c.execute("DROP TABLESPACE IF EXISTS hostile_ts")
        c.execute(f"CREATE TABLESPACE hostile_ts LOCATION '{location}'")
        c.execute(f"GRANT CREATE ON TABLESPACE hostile_ts TO {CONSUMER}")
    try:
        with cluster.connect(db) as c:
            pgtools.install_extension(c, owner=OWNER)
            c.execute(f"GRANT idempotency_consumer TO {CONSUMER}")
        with cluster.connect(db, user=CONSUMER) as c:
            c.execute("SET default_tablespace = hostile_ts")
            c.execute("SELECT idem_once('k')")
        with cluster.connect(db) as c:
            placed = c.execute("""SELECT pg_catalog.count(*) FROM pg_catalog.pg_class
                                   WHERE relnamespace = 'idempotency'::pg_catalog.regnamespace::oid
                                     AND reltablespace <> 0""").fetchone()[0]
        assert placed == 0, f"{placed} relations of the storage went to the consumer's tablespace"
    finally:
        with cluster.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            c.execute("DROP TABLESPACE IF EXISTS hostile_ts")
        shutil.rmtree(location, ignore_errors=True)


def _sqlstate(conn, sql, params=None):
    try:
        conn.execute(sql, params)
        return "ok"
    except psycopg.Error as e:
        return e.sqlstate


@pytest.fixture
def consumer(cluster):
    """A session of a consumer role in a database with the extension and its partitions."""
    db = "hostile_limits"
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute("SELECT FROM idem_maintenance()")
        c.execute(f"GRANT idempotency_consumer TO {CONSUMER}")
    with cluster.connect(db, user=CONSUMER) as c:
        yield c


@pytest.mark.native_only("policy settings refused at SET (superuser-only GUCs of the library); the SQL edition "
                         "accepts a consumer's SET and lets it only tighten a limit")
def test_policy_settings_are_superusers(consumer):
    """A policy of the database is not a consumer's to change for its own session."""
    for guc, value in (("max_attempts", "1000000"), ("filter_cache", "'2TB'"), ("max_lease_ttl", "'1000000s'")):
        assert _sqlstate(consumer, f"SET idempotency.{guc} = {value}") == "42501", guc


def test_no_lease_of_years(consumer):
    """A lease is at most idempotency.max_lease_ttl (a day by default), taken or renewed."""
    assert _sqlstate(consumer, "SELECT * FROM idem_claim('long', ttl => '290000 years')") == "22023"
    assert _sqlstate(consumer, "SELECT * FROM idem_claim('long', ttl => '25 hours')") == "22023"
    assert _sqlstate(consumer, "SELECT * FROM idem_claim_batch(ARRAY['long'], ttl => '1000 days')") == "22023"
    token = consumer.execute("SELECT token FROM idem_claim('long', ttl => '1 minute')").fetchone()[0]
    assert _sqlstate(consumer, "SELECT idem_heartbeat('long', ttl => '1000 days', token => %s)", (token,)) == "22023"


def _peak_mb(conn):
    pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def test_arrays_counted_before_conversion(consumer):
    """An oversized batch is refused from the array's header: the call allocates nothing for its elements.
    The backend's peak memory after building a 10,000,000-element array alone is the reference; the refused
    batch of the same array must not raise it (0.5.0 converted every element first: 170 MB -> 634 MB)."""
    build = "pg_catalog.array_fill('k'::text, ARRAY[10000000])"
    consumer.execute(f"SELECT pg_catalog.array_length({build}, 1)")
    reference = _peak_mb(consumer)
    assert _sqlstate(consumer, f"SELECT * FROM idem_once_batch({build})") == "54000"
    assert _sqlstate(consumer, f"SELECT * FROM idem_claim_batch({build})") == "54000"
    assert _peak_mb(consumer) <= reference * 1.1, \
        f"refusing the batch took the backend from {reference:.0f} MB to {_peak_mb(consumer):.0f} MB"
    # Payloads and tokens are counted against the keys before they are read.
    assert _sqlstate(consumer, "SELECT idem_complete_batch(ARRAY['a'], pg_catalog.array_fill(NULL::jsonb, ARRAY[3000000]))") == "22023"
    assert _sqlstate(consumer, "SELECT idem_complete_batch(ARRAY['a'], NULL, tokens => pg_catalog.array_fill(1::bigint, ARRAY[3000000]))") == "22023"
    assert consumer.execute("SELECT 1").fetchone()[0] == 1


def test_fingerprint_document_size_before_parse(consumer):
    """idem_fingerprint parses its document into a tree several times its size: over
    idempotency.max_payload_bytes it is refused first."""
    assert _sqlstate(consumer, "SELECT idem_fingerprint(pg_catalog.to_jsonb(pg_catalog.repeat('x', 2000000)))") == "54000"
    assert len(consumer.execute("SELECT idem_fingerprint('{\"a\": 1}')").fetchone()[0]) == 64


def test_monitor_reads_counts_only(cluster):
    db = "hostile_monitor"
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute("SELECT FROM idem_maintenance()")
        c.execute("SELECT * FROM idem_claim('secret-key', ttl => '1 hour')")
        c.execute("BEGIN")
        c.execute("SELECT * FROM idem_claim('dead')")
        c.execute("""SELECT idem_fail('dead', '{"card": "4111 1111 1111 1111"}', retryable => false)""")
        c.execute("COMMIT")
    with cluster.connect(db, user=MONITOR) as c:
        for sql in ("SELECT * FROM idempotency.stats", "SELECT * FROM idem_stats()",
                    "SELECT * FROM idem_metrics()", "SELECT * FROM idempotency.partitions"):
            assert _sqlstate(c, sql) == "ok", sql
        for sql in ("SELECT * FROM idempotency.in_flight", "SELECT * FROM idempotency.dead_letters"):
            assert _sqlstate(c, sql) == "42501", sql


ROOT = pathlib.Path(__file__).resolve().parents[2]


def _released():
    """(version, commit) of every released version the upgrade test knows (tests/upgrade/versions)."""
    lines = (ROOT / "tests" / "upgrade" / "versions").read_text().splitlines()
    return [tuple(line.split()) for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.native_only("ALTER EXTENSION UPDATE from the native extension's released versions")
@pytest.mark.parametrize("old,sha", _released())
def test_owner_planted_before_update(old, sha):
    """The owner plants its lookalikes in a database where an old version is installed; a superuser then
    runs ALTER EXTENSION idempotency UPDATE (every upgrade script from `old` on). Nothing of the owner's
    may be bound into the extension or run. The old build comes from tests/upgrade/build-old (cached)."""
    built = subprocess.run([str(ROOT / "tests" / "upgrade" / "build-old"), old, sha], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    old_dir = pathlib.Path(built.stdout.strip().splitlines()[-1])
    new_files = pgtools.copy_ext_files(f"/tmp/idem-hostile-new-{old}")
    tree = pgtools.PrivateTree(f"/tmp/idem-hostile-tree-{old}")
    tree.build()
    tree.install([old_dir / "idempotency.so", old_dir / "idempotency.control", old_dir / f"idempotency--{old}.sql"])
    cluster = pgtools.Cluster(pgtools.port("hostile", 1), ["shared_preload_libraries = 'idempotency'"],
                              bindir=tree.bin, listen="")
    db = "hostile_update"
    try:
        cluster.init()
        cluster.start()
        _owner_db(cluster, db)
        with cluster.connect(db) as c:
            pgtools.install_extension(c, owner=OWNER)
            c.execute("SELECT FROM idem_maintenance()")
        with cluster.connect(db, user=OWNER) as c:
            c.execute(TRAPS)
        _armed(cluster, db)
        cluster.stop()
        tree.install(new_files)
        cluster.start()
        with cluster.connect(db) as c:
            c.execute("ALTER EXTENSION idempotency UPDATE")
            assert _bound(c) == 0, f"{_bound(c)} objects of the extension depend on the owner's lookalikes in public"
        _use_everything(cluster, db)
        log, su = _fired(cluster, db)
        assert log == [], f"the owner's lookalikes ran during or after the update from {old}: {log}"
        assert su is False, f"the database owner became a superuser through the update from {old}"
    finally:
        cluster.stop()
        shutil.rmtree(tree.root, ignore_errors=True)


OTHER = "hostile_other"


def test_scopes_fenced_by_grants(cluster):
    """Without grants every consumer is trusted with every scope (documented); with them, a consumer
    reaches only its own scopes and groups, whatever it knows of the others' keys and tokens."""
    db = "hostile_grants"
    _owner_db(cluster, db)
    with cluster.connect() as c:
        if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OTHER,)).fetchone():
            c.execute(f"CREATE ROLE {OTHER} LOGIN IN ROLE idempotency_consumer")
        c.execute("DROP ROLE IF EXISTS hostile_team_a")
        c.execute("CREATE ROLE hostile_team_a NOLOGIN")
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute("SELECT FROM idem_maintenance()")
        c.execute(f"GRANT idempotency_consumer TO {CONSUMER}, {OTHER}")
    victim = cluster.connect(db, user=CONSUMER)
    attacker = cluster.connect(db, user=OTHER)
    try:
        token = victim.execute("SELECT token FROM idem_claim('pay-1', ttl => '1 hour', scope => 'tenant-a/pay')"
                               ).fetchone()[0]
        victim.execute("SELECT idem_record_offset('group-a', 't', 0, 41, generation => 3)")
        # No grant yet: the attacker reads the victim's live token and could complete its lease.
        assert attacker.execute("SELECT token FROM idem_status('pay-1', scope => 'tenant-a/pay')").fetchone()[0] == token
        # The DBA fences the scopes: the victim's role through a group role, the attacker its own prefix.
        with cluster.connect(db) as dba:
            dba.execute(f"GRANT hostile_team_a TO {CONSUMER}")
            assert dba.execute("SELECT idem_grant_scope('hostile_team_a', 'tenant-a/*')").fetchone()[0] is True
            assert dba.execute("SELECT idem_grant_scope('hostile_team_a', 'tenant-a/*')").fetchone()[0] is False
            dba.execute(f"SELECT idem_grant_scope('{OTHER}', 'tenant-b/*')")
            dba.execute("SELECT idem_grant_group('hostile_team_a', 'group-a')")
            dba.execute(f"SELECT idem_grant_group('{OTHER}', 'group-b')")
            before = dba.execute("SELECT count(*), max(updated_at) FROM idempotency.records").fetchone()
        # The attacker's long-lived session sees the grants at its next statement.
        for sql in ("SELECT * FROM idem_status('pay-1', scope => 'tenant-a/pay')",
                    f"SELECT idem_complete('pay-1', '{{\"forged\": 1}}', scope => 'tenant-a/pay', token => {token})",
                    f"SELECT idem_fail('pay-1', '{{}}', scope => 'tenant-a/pay', token => {token})",
                    f"SELECT idem_heartbeat('pay-1', scope => 'tenant-a/pay', token => {token})",
                    "SELECT * FROM idem_claim('pay-2', scope => 'tenant-a/pay')",
                    "SELECT idem_once('pay-3', scope => 'tenant-a/pay')",
                    "SELECT * FROM idem_claim_batch(ARRAY['pay-4'], scope => 'tenant-a/pay')",
                    "SELECT * FROM idem_once_batch(ARRAY['pay-5'], scope => 'tenant-a/pay')",
                    "SELECT idem_complete_batch(ARRAY['pay-1'], scope => 'tenant-a/pay')",
                    "SELECT idem_once('x', scope => 'tenant-ab')",
                    "SELECT idem_record_offset('group-a', 't', 0, 1000000, generation => 9223372036854775807)",
                    "SELECT idem_next_offset('group-a', 't', 0)",
                    "SELECT * FROM idem_offsets('group-a')"):
            assert _sqlstate(attacker, sql) == "42501", sql
        # Its own scopes and groups work.
        assert attacker.execute("SELECT idem_once('mine', scope => 'tenant-b/x')").fetchone()[0] is True
        assert attacker.execute("SELECT idem_record_offset('group-b', 't', 0, 1)").fetchone()[0] is True
        # Nothing of the victim's was read or written.
        with cluster.connect(db) as dba:
            after = dba.execute("SELECT count(*) - 1, max(updated_at) FILTER (WHERE scope <> 'tenant-b/x') "
                                "FROM idempotency.records").fetchone()
            offset = dba.execute("SELECT next_offset, generation FROM idempotency.offsets "
                                 "WHERE consumer_group = 'group-a'").fetchone()
        assert after == before and offset == (42, 3), (before, after, offset)
        # The victim, through its group role, keeps working.
        victim.execute("BEGIN")
        victim.execute(f"SELECT idem_complete('pay-1', '{{\"ok\": 1}}', scope => 'tenant-a/pay', token => {token})")
        victim.execute("COMMIT")
        assert victim.execute("SELECT idem_record_offset('group-a', 't', 0, 42, generation => 3)").fetchone()[0] is True
        # Revoking the victim's group role takes effect in its open session.
        with cluster.connect(db) as dba:
            dba.execute(f"REVOKE hostile_team_a FROM {CONSUMER}")
        assert _sqlstate(victim, "SELECT idem_once('later', scope => 'tenant-a/pay')") == "42501"
        # Without any grant of a kind, that kind is off again.
        with cluster.connect(db) as dba:
            dba.execute("SELECT idem_revoke_scope('hostile_team_a', 'tenant-a/*')")
            dba.execute(f"SELECT idem_revoke_scope('{OTHER}', 'tenant-b/*')")
        assert _sqlstate(attacker, "SELECT idem_once('open-again', scope => 'tenant-a/pay')") == "ok"
        # ... unless a superuser requires grants: then nothing without one.
        with cluster.connect(db) as dba:
            dba.execute(f"ALTER ROLE {OTHER} SET idempotency.require_scope_grants = on")
        with cluster.connect(db, user=OTHER) as fresh:
            assert _sqlstate(fresh, "SELECT idem_once('required', scope => 'tenant-b/x')") == "42501"
            if pgtools.sql_edition():
                # No library to make the setting superuser-only: the SET is accepted, and must change nothing.
                assert _sqlstate(fresh, "SET idempotency.require_scope_grants = off") == "ok"
                assert _sqlstate(fresh, "SELECT idem_once('required', scope => 'tenant-b/x')") == "42501", \
                    "a consumer's SET idempotency.require_scope_grants = off undid the role's requirement"
            else:
                assert _sqlstate(fresh, "SET idempotency.require_scope_grants = off") == "42501"
        with cluster.connect(db) as dba:
            dba.execute(f"ALTER ROLE {OTHER} RESET idempotency.require_scope_grants")
            # A zombie's huge generation is undone by the DBA: idem_reset_offset sets it.
            dba.execute("SELECT idem_record_offset('group-a', 't', 0, 50, generation => 1000000)")
            dba.execute("SELECT idem_reset_offset('group-a', 't', 0, 43, generation => 4)")
            assert dba.execute("SELECT next_offset, generation FROM idempotency.offsets "
                               "WHERE consumer_group = 'group-a'").fetchone() == (43, 4)
    finally:
        victim.close()
        attacker.close()


def test_a_failed_step_undoes_only_itself(cluster):
    """A partition that cannot be dropped (a DBA's view reads it) fails its own drop: the round still
    premakes, drops the other expired partitions, seals and reclaims, and records the error (0.5.0: the
    round was one transaction, the error undid all of it, and retention stopped)."""
    db = "hostile_round"
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute("SELECT idempotency.premake_partitions(now() - interval '12 days')")
        old = c.execute("SELECT partition::text FROM idempotency.partitions ORDER BY range_from").fetchall()
        # (Not the oldest: the SQL edition writes the claim below into the oldest unsealed partition, which
        # then keeps its retention from its seal, not from its end: tests/clock/test_retention.py.)
        pinned, others = old[1][0], [r[0] for r in old[2:4]]
        c.execute(f"CREATE VIEW public.pin AS SELECT * FROM {pinned}")
        c.execute("SELECT * FROM idem_claim('stuck', ttl => '1 millisecond')")
        time.sleep(0.01)
        # As of a day and two hours ahead: the stuck lease is past idempotency.reclaim_after (1 h), and
        # the premake window reaches a day no partition covers yet, whatever the hour now (as of only
        # two hours ahead, a run before 22:00 UTC had nothing to premake).
        made, dropped, _, reclaimed = c.execute(
            "SELECT * FROM idem_maintenance(now() + interval '1 day 2 hours')").fetchone()
        left = {r[0] for r in c.execute("SELECT partition::text FROM idempotency.partitions").fetchall()}
        state = c.execute("SELECT last_error FROM idempotency.maintenance_state()").fetchone()
    assert pinned in left, "the pinned partition is gone"
    assert not (set(others) & left), f"the other expired partitions were not dropped: {set(others) & left}"
    assert made > 0 and dropped >= 2 and reclaimed == 1, (made, dropped, reclaimed)
    assert state is not None and state[0] is not None and pinned.split(".")[-1] in state[0], state


def test_reclaim_is_bounded_per_round(cluster):
    """A round reclaims at most 1,000 stuck leases, each holding its key's lock until the round commits
    (0.5.0: 10,000, most of a default lock table); the rest go in the next rounds."""
    db = "hostile_reclaim"
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute("SELECT FROM idem_maintenance()")
        c.execute("SELECT count(*) FROM idem_claim_batch(ARRAY(SELECT 's' || g FROM generate_series(1, 1000) g), "
                  "ttl => '1 millisecond')")
        c.execute("SELECT count(*) FROM idem_claim_batch(ARRAY(SELECT 't' || g FROM generate_series(1, 1000) g), "
                  "ttl => '1 millisecond')")
        c.execute("SELECT count(*) FROM idem_claim_batch(ARRAY(SELECT 'u' || g FROM generate_series(1, 500) g), "
                  "ttl => '1 millisecond')")
        time.sleep(0.01)
        rounds = [c.execute("SELECT leases_reclaimed FROM idem_maintenance(now() + interval '2 hours')").fetchone()[0]
                  for _ in range(4)]
    assert rounds == [1000, 1000, 500, 0], rounds


def test_on_demand_partition_does_not_lock_out_readers(cluster):
    """A consumer whose claim makes the partitions (none premade) and whose transaction then stays open
    holds no ACCESS EXCLUSIVE lock on idempotency.records: monitoring and pg_dump, which read the record
    table, go on (0.5.0: CREATE TABLE ... PARTITION OF held it until the consumer committed)."""
    db = "hostile_ondemand"
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute(f"GRANT idempotency_consumer TO {CONSUMER}")
    with cluster.connect(db, user=CONSUMER) as holder, cluster.connect(db) as reader:
        holder.execute("BEGIN")
        assert holder.execute("SELECT idem_once('first')").fetchone()[0] is True
        pid = holder.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
        modes = {r[0] for r in reader.execute(
            "SELECT mode FROM pg_catalog.pg_locks WHERE pid = %s AND granted "
            "AND relation = 'idempotency.records'::pg_catalog.regclass::oid", (pid,)).fetchall()}
        reader.execute("SET lock_timeout = '2s'")
        state = _sqlstate(reader, "SELECT pg_catalog.count(*) FROM idempotency.records")
        metrics = _sqlstate(reader, "SELECT * FROM idem_metrics()")
        holder.execute("COMMIT")
    assert "AccessExclusiveLock" not in modes, f"the consumer holds {sorted(modes)} on idempotency.records"
    assert state == "ok" and metrics == "ok", (state, metrics)


@pytest.mark.native_only("sealed-partition filters")
def test_filter_chunks_with_an_extra_column(cluster):
    """A DBA adds a column to idempotency.filter_chunks. Claims that read a sealed partition's filter
    from shared buffers must not deform its rows into arrays sized for three columns (0.5.0 wrote past
    them); they probe the index instead, and every sealed key is still a duplicate."""
    db = "hostile_chunks"
    _owner_db(cluster, db)
    with cluster.connect(db) as c:
        pgtools.install_extension(c, owner=OWNER)
        c.execute("SELECT FROM idem_maintenance()")
        c.execute("SELECT count(*) FROM idem_once_batch(ARRAY(SELECT 'sealed-' || g FROM generate_series(1, 500) g))")
        present = c.execute("SELECT partition::oid FROM idempotency.partitions "
                            "WHERE range_from <= now() AND range_to > now()").fetchone()[0]
        assert c.execute("SELECT idempotency.seal_partition(%s)", (present,)).fetchone()[0] is True
        assert c.execute("SELECT blocks > 0 FROM idempotency.sealed WHERE partition = %s", (present,)).fetchone()[0]
        c.execute("ALTER TABLE idempotency.filter_chunks ADD COLUMN note text DEFAULT 'x'")
    with cluster.connect(db) as c:
        c.execute("SET idempotency.filter_cache = 0")  # read the chunk rows in place
        renewed = c.execute("SELECT count(*) FROM idem_once_batch(ARRAY(SELECT 'sealed-' || g "
                            "FROM generate_series(1, 500) g))").fetchone()[0]
        assert renewed == 0, f"{renewed} sealed keys answered as new"
        assert c.execute("SELECT idem_once('sealed-1')").fetchone()[0] is False
