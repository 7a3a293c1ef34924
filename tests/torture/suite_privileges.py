"""Suite 4: privileges.

* A role with only `GRANT idempotency_consumer` uses the whole consumer API, and every direct access to
  the storage (tables, partitions, view, sequence, schema) or to the owner's functions is 42501.
* A role without it gets 42501 from every function and every table.
* The catalog: every SECURITY DEFINER function of the extension pins search_path to pg_catalog, pg_temp
  (the consumer functions are not SECURITY DEFINER: they switch to the owner inside, with pg_catalog as
  the only search path);
  no function is executable by PUBLIC; idempotency_consumer can execute exactly the consumer functions;
  nobody but the owner has any privilege on the storage; a partition that a consumer's claim creates on
  demand belongs to the owner.
* A malicious search_path: a schema owned by an attacker (who holds idempotency_consumer), first in its
  search_path (and before pg_catalog), shadows the built-ins the extension's SQL uses (now, nextval,
  unnest, date_bin, generate_series, format, to_char, max, coalesce-likes...) and the operators (=, <,
  +, ||, * ...). Every shadow writes a row into a log table before doing the real work. The trap is
  shown to be armed (the attacker's own unqualified calls do hit it), then the whole API runs as the
  attacker and as a superuser with that search_path, including the on-demand creation of a partition and
  a maintenance round that drops partitions: the log must stay empty.
"""
import psycopg

import pgtools
from harness import Cluster, log, port

PORT = port(3)
DB = "privs"
CONSUMER, OUTSIDER, ATTACKER = "priv_consumer", "priv_outsider", "priv_attacker"
ADMIN, MONITOR = "priv_admin", "priv_monitor"

# What monitoring reads: pg_monitor and idempotency_admin, nobody else.
OBSERVE = [
    "SELECT * FROM idempotency.stats",
    "SELECT * FROM idempotency.partitions",
    "SELECT * FROM idem_stats()",
    "SELECT * FROM idem_metrics()",
]
# Keys, live fencing tokens and stored errors: idempotency_admin only, not pg_monitor.
OBSERVE_KEYS = [
    "SELECT * FROM idempotency.in_flight",
    "SELECT * FROM idempotency.dead_letters",
]
# What only idempotency_admin may do.
STEER = [
    "SELECT idem_stats_reset('consumer')",
    "SELECT idem_redrive('b3', scope => 'consumer')",
    "SELECT idem_redrive_scope('consumer')",
    "SELECT idem_forget('k2', scope => 'consumer')",
]
# The only privileges on the storage schema besides the owner's: reading the views, and the schema's
# USAGE that reaching them needs.
VIEW_READERS = ({(f"idempotency.{v}", r, "SELECT") for v in ("stats", "partitions")
                 for r in ("pg_monitor", "idempotency_admin")}
                | {(f"idempotency.{v}", "idempotency_admin", "SELECT") for v in ("in_flight", "dead_letters", "scope_grants")})

CONSUMER_FUNCTIONS = {
    "idem_claim(text,interval,text,text,boolean)", "idem_complete(text,jsonb,text,bigint)",
    "idem_fail(text,jsonb,boolean,text,bigint)", "idem_heartbeat(text,interval,text,bigint)",
    "idem_once(text,text)", "idem_status(text,text)", "idem_claim_batch(text[],interval,text)",
    "idem_complete_batch(text[],jsonb[],text,bigint[])", "idem_once_batch(text[],text)",
    "idem_record_offset(text,text,integer,bigint,bigint)", "idem_next_offset(text,text,integer)",
    "idem_offsets(text,text)", "idem_key(uuid,text[])", "idem_fingerprint(jsonb,text[])",
}

# The consumer API, one transaction per entry; {s} is a scope of the caller's own.
API = [
    "BEGIN",
    "SELECT outcome FROM idem_claim('k1', scope => '{s}')",
    "SELECT idem_complete('k1', '{{\"ok\": 1}}', scope => '{s}')",
    "COMMIT",
    "SELECT outcome FROM idem_claim('k1', scope => '{s}')",
    "SELECT idem_once('k2', scope => '{s}')",
    "SELECT * FROM idem_status('k1', scope => '{s}')",
    "BEGIN",
    "SELECT * FROM idem_claim_batch(ARRAY['b1','b2','b3'], scope => '{s}')",
    "SELECT idem_complete_batch(ARRAY['b1','b2'], ARRAY['1','2']::jsonb[], scope => '{s}')",
    "SELECT idem_fail('b3', '{{\"e\": 1}}', retryable => false, scope => '{s}')",
    "COMMIT",
    "SELECT * FROM idem_once_batch(ARRAY['o1','o2','o1'], scope => '{s}')",
    "SELECT token FROM idem_claim('lease', ttl => '1 hour', scope => '{s}')",
    "SELECT idem_heartbeat('lease', ttl => '2 hours', scope => '{s}', token => (SELECT token FROM idem_status('lease', scope => '{s}')))",
    "SELECT idem_fail('lease', NULL, scope => '{s}', token => (SELECT token FROM idem_status('lease', scope => '{s}')))",
    "SELECT outcome FROM idem_claim('lease', scope => '{s}', fingerprint => 'f')",
    "SELECT idem_record_offset('{s}', 'topic', 0, 41, 1)",
    "SELECT idem_record_offset('{s}', 'topic', 0, 40, 1)",
    "SELECT idem_next_offset('{s}', 'topic', 0)",
    "SELECT * FROM idem_offsets('{s}')",
    "SELECT * FROM idem_offsets('{s}', 'topic')",
]

# Direct access to the storage and to the owner's functions: 42501 for consumers and outsiders.
DENIED = [
    "SELECT count(*) FROM idempotency.records",
    "SELECT * FROM idempotency.offsets",
    "SELECT * FROM idempotency.partitions",
    "SELECT * FROM idempotency.{partition}",
    "INSERT INTO idempotency.records (scope, key, status, created_at) VALUES ('x', 'x', 'completed', now())",
    "INSERT INTO idempotency.{partition} (scope, key, status, created_at) VALUES ('x', 'x', 'completed', now())",
    "INSERT INTO idempotency.offsets VALUES ('g', 't', 0, 1, 1, now())",
    "UPDATE idempotency.records SET status = 'pending'",
    "UPDATE idempotency.offsets SET next_offset = 0",
    "DELETE FROM idempotency.records",
    "DELETE FROM idempotency.offsets",
    "TRUNCATE idempotency.records",
    "TRUNCATE idempotency.offsets",
    "COPY idempotency.records TO STDOUT",
    "LOCK TABLE idempotency.records IN ACCESS EXCLUSIVE MODE",
    "SELECT nextval('idempotency.token_seq')",
    "SELECT setval('idempotency.token_seq', 1)",
    "SELECT last_value FROM idempotency.token_seq",
    "CREATE TABLE idempotency.mine (x int)",
    "CREATE FUNCTION idempotency.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "ALTER TABLE idempotency.records ADD COLUMN x int",
    "DROP TABLE idempotency.{partition}",
    "CREATE TABLE idempotency.records_p2999_01_01 PARTITION OF idempotency.records FOR VALUES FROM ('2999-01-01') TO ('2999-01-02')",
    "SELECT idem_reset_offset('g', 't', 0, 0)",
    "SELECT * FROM idem_maintenance()",
    "SELECT * FROM idem_maintenance(now() + interval '30 days')",
    "SELECT idempotency.premake_partitions(now())",
    "SELECT idempotency.drop_partition('idempotency.{partition}', 1)",
    "SELECT idempotency.adopt_records('[]')",
    "SELECT idem_partman_handover()",
    "SELECT * FROM idempotency.stats",
    "SELECT * FROM idempotency.in_flight",
    "SELECT * FROM idempotency.dead_letters",
    "SELECT * FROM idem_stats()",
    "SELECT * FROM idem_metrics()",
    "SELECT idem_stats_reset()",
    "SELECT idem_redrive('k1', scope => 'consumer')",
    "SELECT idem_redrive_scope('consumer')",
    "SELECT idem_forget('k1', scope => 'consumer')",
    "LOAD 'idempotency'",
    "ALTER EXTENSION idempotency UPDATE",
    "DROP EXTENSION idempotency",
]

SHADOW_DDL = """
CREATE TABLE evil.hijack_log (what text, by_user name DEFAULT current_user, at timestamptz DEFAULT pg_catalog.clock_timestamp());
GRANT INSERT, SELECT ON evil.hijack_log TO PUBLIC;
CREATE FUNCTION evil.hit(w text) RETURNS void LANGUAGE plpgsql SECURITY INVOKER AS
  $$ BEGIN INSERT INTO evil.hijack_log (what) VALUES (w); END $$;
GRANT EXECUTE ON FUNCTION evil.hit(text) TO PUBLIC;

CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('now()'); RETURN pg_catalog.now(); END $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('clock_timestamp()'); RETURN pg_catalog.clock_timestamp(); END $$;
CREATE FUNCTION evil.transaction_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('transaction_timestamp()'); RETURN pg_catalog.now(); END $$;
CREATE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('nextval(regclass)'); RETURN pg_catalog.nextval($1); END $$;
CREATE FUNCTION evil.nextval(text) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('nextval(text)'); RETURN pg_catalog.nextval($1::regclass); END $$;
CREATE FUNCTION evil.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('unnest(anyarray)'); RETURN QUERY SELECT * FROM pg_catalog.unnest($1); END $$;
CREATE FUNCTION evil.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('unnest(text[])'); RETURN QUERY SELECT * FROM pg_catalog.unnest($1); END $$;
CREATE FUNCTION evil.unnest(text[], text[]) RETURNS TABLE (a text, b text) LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('unnest(text[],text[])'); RETURN QUERY SELECT * FROM pg_catalog.unnest($1, $2); END $$;
CREATE FUNCTION evil.date_bin(interval, timestamptz, timestamptz) RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('date_bin'); RETURN pg_catalog.date_bin($1, $2, $3); END $$;
CREATE FUNCTION evil.generate_series(timestamptz, timestamptz, interval) RETURNS SETOF timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('generate_series'); RETURN QUERY SELECT * FROM pg_catalog.generate_series($1, $2, $3); END $$;
CREATE FUNCTION evil.format(text, text, timestamptz, timestamptz) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('format(text,text,timestamptz,timestamptz)'); RETURN pg_catalog.format($1, $2, $3, $4); END $$;
CREATE FUNCTION evil.format(text, VARIADIC text[]) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('format(text,variadic text[])'); RETURN pg_catalog.format($1, VARIADIC $2); END $$;
CREATE FUNCTION evil.to_char(timestamptz, text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('to_char'); RETURN pg_catalog.to_char($1, $2); END $$;
CREATE FUNCTION evil.to_char(timestamp, text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('to_char(timestamp)'); RETURN pg_catalog.to_char($1, $2); END $$;
CREATE FUNCTION evil.regexp_match(text, text) RETURNS text[] LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('regexp_match'); RETURN pg_catalog.regexp_match($1, $2); END $$;
CREATE FUNCTION evil.current_setting(text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('current_setting(text)'); RETURN pg_catalog.current_setting($1); END $$;
CREATE FUNCTION evil.current_setting(text, boolean) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('current_setting(text,bool)'); RETURN pg_catalog.current_setting($1, $2); END $$;
CREATE FUNCTION evil.set_config(text, text, boolean) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('set_config'); RETURN pg_catalog.set_config($1, $2, $3); END $$;
CREATE FUNCTION evil.coalesce(text, text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('coalesce(text,text)'); RETURN $1; END $$;
CREATE FUNCTION evil.nullif(text, text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('nullif'); RETURN $1; END $$;
CREATE FUNCTION evil.greatest(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('greatest'); RETURN $1; END $$;
CREATE FUNCTION evil.to_jsonb(anyelement) RETURNS jsonb LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('to_jsonb'); RETURN pg_catalog.to_jsonb($1); END $$;
CREATE FUNCTION evil.jsonb_build_object(text, text) RETURNS jsonb LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('jsonb_build_object'); RETURN pg_catalog.jsonb_build_object($1, $2); END $$;
CREATE FUNCTION evil.length(text) RETURNS integer LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('length'); RETURN pg_catalog.length($1); END $$;
CREATE FUNCTION evil.octet_length(text) RETURNS integer LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('octet_length'); RETURN pg_catalog.octet_length($1); END $$;
CREATE FUNCTION evil.lower(text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('lower'); RETURN pg_catalog.lower($1); END $$;
CREATE FUNCTION evil.pg_get_expr(pg_node_tree, oid) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('pg_get_expr'); RETURN pg_catalog.pg_get_expr($1, $2); END $$;
CREATE FUNCTION evil.pg_total_relation_size(regclass) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('pg_total_relation_size'); RETURN pg_catalog.pg_total_relation_size($1); END $$;
CREATE FUNCTION evil.quote_ident(text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('quote_ident'); RETURN pg_catalog.quote_ident($1); END $$;

CREATE FUNCTION evil.max_sfunc(timestamptz, timestamptz) RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('max(timestamptz)'); RETURN pg_catalog.greatest($1, $2); END $$;
CREATE AGGREGATE evil.max(timestamptz) (SFUNC = evil.max_sfunc, STYPE = timestamptz);
CREATE FUNCTION evil.min_sfunc(timestamptz, timestamptz) RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('min(timestamptz)'); RETURN pg_catalog.least($1, $2); END $$;
CREATE AGGREGATE evil.min(timestamptz) (SFUNC = evil.min_sfunc, STYPE = timestamptz);
CREATE FUNCTION evil.count_sfunc(bigint) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('count(*)'); RETURN $1 + 1; END $$;
CREATE AGGREGATE evil.count(*) (SFUNC = evil.count_sfunc, STYPE = bigint, INITCOND = '0');

CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('=(text,text)'); RETURN pg_catalog.texteq($1, $2); END $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
CREATE FUNCTION evil.textne(text, text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('<>(text,text)'); RETURN pg_catalog.textne($1, $2); END $$;
CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.textne);
CREATE FUNCTION evil.textcat(text, text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('||(text,text)'); RETURN pg_catalog.textcat($1, $2); END $$;
CREATE OPERATOR evil.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.textcat);
CREATE FUNCTION evil.int8eq(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('=(bigint,bigint)'); RETURN pg_catalog.int8eq($1, $2); END $$;
CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8eq);
CREATE FUNCTION evil.int4eq(integer, integer) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('=(int,int)'); RETURN pg_catalog.int4eq($1, $2); END $$;
CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int4eq);
CREATE FUNCTION evil.int8gt(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('>(bigint,bigint)'); RETURN pg_catalog.int8gt($1, $2); END $$;
CREATE OPERATOR evil.> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8gt);
CREATE FUNCTION evil.tslt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('<(timestamptz)'); RETURN pg_catalog.timestamptz_lt($1, $2); END $$;
CREATE OPERATOR evil.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tslt);
CREATE FUNCTION evil.tsgt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('>(timestamptz)'); RETURN pg_catalog.timestamptz_gt($1, $2); END $$;
CREATE OPERATOR evil.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tsgt);
CREATE FUNCTION evil.tsle(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('<=(timestamptz)'); RETURN pg_catalog.timestamptz_le($1, $2); END $$;
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tsle);
CREATE FUNCTION evil.tseq(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('=(timestamptz)'); RETURN pg_catalog.timestamptz_eq($1, $2); END $$;
CREATE OPERATOR evil.= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tseq);
CREATE FUNCTION evil.tspl(timestamptz, interval) RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('+(timestamptz,interval)'); RETURN pg_catalog.timestamptz_pl_interval($1, $2); END $$;
CREATE OPERATOR evil.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.tspl);
CREATE FUNCTION evil.tsmi(timestamptz, interval) RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('-(timestamptz,interval)'); RETURN pg_catalog.timestamptz_mi_interval($1, $2); END $$;
CREATE OPERATOR evil.- (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.tsmi);
CREATE FUNCTION evil.ivmul(interval, integer) RETURNS interval LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('*(interval,int)'); RETURN pg_catalog.interval_mul($1, $2::float8); END $$;
CREATE OPERATOR evil.* (LEFTARG = interval, RIGHTARG = integer, FUNCTION = evil.ivmul);
CREATE FUNCTION evil.ivge(interval, interval) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.hit('>=(interval)'); RETURN pg_catalog.interval_ge($1, $2); END $$;
CREATE OPERATOR evil.>= (LEFTARG = interval, RIGHTARG = interval, FUNCTION = evil.ivge);
"""


def run(install, opts, result):
    cluster = Cluster(install, PORT)
    cluster.start()
    checks = {"api ok": 0, "denied": 0, "shadows": 0, "catalog": 0, "observe ok": 0}
    try:
        cluster.create_db(DB)
        with cluster.connect(DB) as su:
            for r in (CONSUMER, OUTSIDER, ATTACKER):
                su.execute(f"CREATE ROLE {r} LOGIN")
            su.execute(f"GRANT idempotency_consumer TO {CONSUMER}, {ATTACKER}")
            su.execute(f"CREATE SCHEMA evil AUTHORIZATION {ATTACKER}")
            su.execute("SELECT idem_once('seed', scope => 'owner')")
            su.execute("SELECT idem_record_offset('owner', 'topic', 0, 10)")
            partition = su.execute("SELECT partition::text FROM idempotency.partitions ORDER BY range_from LIMIT 1"
                                   ).fetchone()[0].split(".")[1]
        _catalog(cluster, result, checks)
        _consumer(cluster, result, checks, partition)
        _outsider(cluster, result, checks, partition)
        _admin_and_monitor(cluster, result, checks)
        _search_path(cluster, result, checks)
        result.figures.update({
            "consumer API calls that worked (consumer role)": checks["api ok"],
            "direct accesses denied with 42501 (consumer and outsider)": checks["denied"],
            "catalog checks": checks["catalog"],
            "monitoring reads and admin calls that worked (pg_monitor, idempotency_admin)": checks["observe ok"],
            "shadowing functions, aggregates and operators planted": checks["shadows"],
            "calls under the malicious search_path": checks.get("hostile calls", 0),
            "shadow objects executed by the extension": checks.get("hijacks", 0),
            "violations": len(result.violations),
        })
        log(f"{checks['api ok']} API calls, {checks['denied']} denials, {checks['shadows']} shadows planted, "
            f"{checks.get('hijacks', 0)} executed")
    finally:
        cluster.stop()


def _admin_and_monitor(cluster, result, checks):
    """pg_monitor reads and cannot steer; idempotency_admin reads and steers; neither consumes."""
    with cluster.connect(DB) as su:
        su.execute(f"CREATE ROLE {ADMIN} LOGIN IN ROLE idempotency_admin")
        su.execute(f"CREATE ROLE {MONITOR} LOGIN IN ROLE pg_monitor")
    with cluster.connect(DB, user=MONITOR) as c:
        for sql in OBSERVE:
            _expect(c, sql, "ok", result, "monitor", checks, "observe ok")
        for sql in OBSERVE_KEYS + STEER + ["SELECT idem_once('m', scope => 'monitor')"]:
            _expect(c, sql, "42501", result, "monitor", checks, "denied")
    with cluster.connect(DB, user=ADMIN) as c:
        for sql in OBSERVE + OBSERVE_KEYS + STEER:
            _expect(c, sql, "ok", result, "admin", checks, "observe ok")
        _expect(c, "SELECT idem_once('a', scope => 'admin')", "42501", result, "admin", checks, "denied")
        # For real, not rolled back: the dead letter b3 (failed by the consumer API run) is redriven.
        if c.execute("SELECT idem_redrive('b3', scope => 'consumer')").fetchone()[0] is not True:
            result.violation("admin: idem_redrive('b3') did not redrive the consumer's failed key")
        state = c.execute("SELECT state, attempts FROM idempotency.in_flight WHERE scope = 'consumer' AND key = 'b3'"
                          ).fetchone()
        if state != ("released", 0):
            result.violation(f"admin: after idem_redrive, b3 in idempotency.in_flight is {state}, expected released/0")


def _expect(conn, sql, code, result, what, checks=None, key=None):
    conn.execute("BEGIN")
    try:
        conn.execute(sql)
        got = "ok"
    except psycopg.Error as e:
        got = e.sqlstate
    conn.execute("ROLLBACK")
    if got != code:
        result.violation(f"{what}: {sql!r}: expected {code}, got {got}")
    elif checks is not None:
        checks[key] += 1


# The functions of the edition under test: the extension's members (native), or the SQL edition's (its
# schema idempotency, and the idem_* functions its plain script put into public).
EXTENSION_FUNCTIONS = """
              FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
              JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency' AND d.deptype = 'e'
"""
EDITION_FUNCTIONS = """
              FROM pg_proc p
             WHERE p.pronamespace = 'idempotency'::regnamespace
                OR (p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\\_%')
"""


def _catalog(cluster, result, checks):
    with cluster.connect(DB) as su:
        rows = su.execute("""
            SELECT p.oid::regprocedure::text, p.prosecdef, coalesce(array_to_string(p.proconfig, ','), ''),
                   EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                            WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'),
                   has_function_privilege('idempotency_consumer', p.oid, 'EXECUTE'),
                   pg_get_userbyid(p.proowner)
        """ + (EDITION_FUNCTIONS if pgtools.sql_edition() else EXTENSION_FUNCTIONS)).fetchall()
        granted = set()
        for sig, secdef, config, public, consumer, owner in rows:
            checks["catalog"] += 1
            plain = sig.replace(" ", "").replace("timestampwithtimezone", "timestamptz")
            if secdef and "search_path=pg_catalog, pg_temp" not in config.replace(", ", ", ") \
                    and config.replace(" ", "") != "search_path=pg_catalog,pg_temp":
                result.violation(f"catalog: SECURITY DEFINER {sig} does not pin search_path (proconfig {config!r})")
            if public:
                result.violation(f"catalog: {sig} is executable by PUBLIC")
            if consumer:
                granted.add(plain)
        if granted != CONSUMER_FUNCTIONS:
            result.violation(f"catalog: idempotency_consumer may execute {sorted(granted ^ CONSUMER_FUNCTIONS)} "
                             f"(difference from the consumer functions of docs/reference.md)")
        # The consumer functions are not SECURITY DEFINER (they switch to the owner inside, see
        # storage::spi::Conn); that they work without any privilege on the storage is the API
        # check above, and that no caller's schema shadows their SQL is _search_path below.
        # Nobody but the owner holds a privilege on the storage, except reading the views (VIEW_READERS).
        acl = su.execute("""
            SELECT c.oid::regclass::text, a.grantee::regrole::text, a.privilege_type
              FROM pg_class c CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
             WHERE c.relnamespace = 'idempotency'::regnamespace AND a.grantee <> c.relowner""").fetchall()
        checks["catalog"] += 1
        # The SQL edition keeps its settings in a table (no library GUCs), which idempotency_admin reads.
        readers = VIEW_READERS | ({("idempotency.settings", "idempotency_admin", "SELECT")} if pgtools.sql_edition() else set())
        if set(acl) != readers:
            result.violation(f"catalog: privileges on the storage other than reading the views: "
                             f"{sorted(set(acl) ^ readers)}")
        nsp = su.execute("""SELECT a.grantee, a.privilege_type FROM pg_namespace n
                             CROSS JOIN LATERAL aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
                             WHERE n.nspname = 'idempotency' AND a.grantee <> n.nspowner""").fetchall()
        checks["catalog"] += 1
        readers = {r[0] for r in su.execute("SELECT oid FROM pg_roles WHERE rolname IN ('pg_monitor', 'idempotency_admin')")}
        for grantee, priv in nsp:
            if (grantee, priv) not in {(r, "USAGE") for r in readers}:
                result.violation(f"catalog: role {grantee} holds {priv} on schema idempotency")


def _consumer(cluster, result, checks, partition):
    with cluster.connect(DB, user=CONSUMER) as c:
        for sql in API:
            try:
                c.execute(sql.format(s="consumer"))
                checks["api ok"] += 1
            except psycopg.Error as e:
                result.violation(f"consumer: {sql!r} failed: {e.sqlstate}: {e}")
                if c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    c.execute("ROLLBACK")
        for sql in DENIED:
            if pgtools.sql_edition() and "EXTENSION idempotency" in sql:
                continue  # the plain script's edition is no extension: nothing to update or drop (42704)
            _expect(c, sql.format(partition=partition), "42501", result, "consumer", checks, "denied")
        # The superuser-only limits: a consumer can raise none of them. (Native: superuser-only settings,
        # refused at SET. The SQL edition has no library to define them: a consumer's SET is accepted and
        # may only tighten a limit, which the max_key_bytes check below holds it to.)
        for guc, value in () if pgtools.sql_edition() else (("max_key_bytes", "'1MB'"), ("max_payload_bytes", "'1GB'"), ("max_batch_keys", "1000000"),
                           ("max_attempts", "1000000"), ("filter_cache", "'2TB'"), ("max_lease_ttl", "'1000d'")):
            _expect(c, f"SET idempotency.{guc} = {value}", "42501", result, "consumer", checks, "denied")
    # Not even by setting the placeholder before the library is loaded in its session.
    with cluster.connect(DB, user=CONSUMER) as c:
        try:
            c.execute("SET idempotency.max_key_bytes = '1MB'")
        except psycopg.Error:
            c.rollback() if c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR else None
        _expect(c, "SELECT idem_claim(repeat('k', 600), scope => 'consumer')", "54000", result,
                "consumer after setting the max_key_bytes placeholder before the library loaded", checks, "denied")
    # A partition created on demand by a consumer's claim belongs to the owner, and grants nothing.
    with cluster.connect(DB) as su:
        today = su.execute("""SELECT partition::text FROM idempotency.partitions
                               WHERE range_from <= now() AND range_to > now()""").fetchone()[0]
        su.execute("CREATE TABLE keep_rows AS SELECT * FROM idempotency.records")
        su.execute(f"DROP TABLE {today}")
    with cluster.connect(DB, user=CONSUMER) as c:
        try:
            c.execute("SELECT idem_once('on-demand', scope => 'consumer')")
        except psycopg.Error as e:
            result.violation(f"consumer: claim that creates today's partition failed: {e.sqlstate}: {e}")
    with cluster.connect(DB) as su:
        row = su.execute("SELECT pg_get_userbyid(relowner), relacl FROM pg_class WHERE oid = %s::regclass",
                         (today,)).fetchone()
        checks["catalog"] += 1
        # The owner of the storage: the bootstrap superuser that ran CREATE EXTENSION (native), or the
        # database owner that ran the SQL edition's script.
        owner = pgtools.EDITION_OWNER if pgtools.sql_edition() else "postgres"
        if row is None or row[0] != owner or row[1] is not None:
            result.violation(f"partition {today} created by a consumer's claim: owner/acl {row}")
        su.execute("INSERT INTO idempotency.records SELECT * FROM keep_rows WHERE (scope, key) <> ('consumer', 'on-demand')")
    with cluster.connect(DB, user=CONSUMER) as c:
        _expect(c, f"SELECT * FROM {today}", "42501", result, "consumer, on-demand partition", checks, "denied")


def _outsider(cluster, result, checks, partition):
    with cluster.connect(DB, user=OUTSIDER) as c:
        for sql in API:
            if sql in ("BEGIN", "COMMIT"):
                continue
            _expect(c, sql.format(s="outsider"), "42501", result, "outsider", checks, "denied")
        for sql in DENIED:
            if pgtools.sql_edition() and "EXTENSION idempotency" in sql:
                continue  # the plain script's edition is no extension: nothing to update or drop (42704)
            _expect(c, sql.format(partition=partition), "42501", result, "outsider", checks, "denied")


def _search_path(cluster, result, checks):
    path = "SET search_path = evil, pg_catalog, public"
    with cluster.connect(DB, user=ATTACKER) as a:
        a.execute(SHADOW_DDL)
        checks["shadows"] = a.execute("""SELECT (SELECT count(*) FROM pg_proc WHERE pronamespace = 'evil'::regnamespace
                                                  AND proname NOT IN ('hit') AND proname NOT LIKE '%sfunc')
                                              + (SELECT count(*) FROM pg_operator WHERE oprnamespace = 'evil'::regnamespace)
                                      """).fetchone()[0]
        # The trap is armed: the attacker's own unqualified calls go to the shadows.
        a.execute(path)
        a.execute("SELECT now(), 'a'::text = 'b'::text, clock_timestamp() + interval '1 s', 'x'::text || 'y'::text")
        armed = {w for (w,) in a.execute("SELECT DISTINCT what FROM evil.hijack_log")}
        if not {"now()", "=(text,text)", "+(timestamptz,interval)", "||(text,text)"} <= armed:
            result.violation(f"privileges: the shadowing trap is not armed (hits: {sorted(armed)})")
        a.execute("TRUNCATE evil.hijack_log")
    calls = 0
    # The attacker (a consumer) runs the whole API with the malicious search_path, a fresh session
    # each time so that the extension plans its statements under it.
    for sql in API:
        with cluster.connect(DB, user=ATTACKER) as a:
            a.execute(path)
            if sql == "COMMIT":
                continue
            try:
                if sql == "BEGIN":
                    continue
                a.execute(sql.format(s="attacker"))
            except psycopg.Error as e:
                if e.sqlstate not in ("55000", "55006", "P0002"):
                    result.violation(f"attacker: {sql!r} failed: {e.sqlstate}: {e}")
            calls += 1
    with cluster.connect(DB, user=ATTACKER) as a:
        a.execute(path)
        for sql in API:
            try:
                a.execute(sql.format(s="attacker2"))
                calls += 1
            except psycopg.Error as e:
                result.violation(f"attacker (one session): {sql!r} failed: {e.sqlstate}: {e}")
                if a.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    a.execute("ROLLBACK")
    # On-demand partition creation under the malicious path: drop the (empty) newest premade
    # partition and today's, then claim from a fresh attacker session.
    with cluster.connect(DB) as su:
        su.execute("CREATE TABLE keep_rows2 AS SELECT * FROM idempotency.records")
        for (p,) in su.execute("""SELECT partition::text FROM idempotency.partitions
                                   WHERE range_to > now() ORDER BY range_from""").fetchall():
            su.execute(f"DROP TABLE {p}")
    with cluster.connect(DB, user=ATTACKER) as a:
        a.execute(path)
        try:
            a.execute("SELECT outcome FROM idem_claim('recreate', scope => 'attacker3')")
            calls += 1
        except psycopg.Error as e:
            result.violation(f"attacker: claim that recreates the partitions failed: {e.sqlstate}: {e}")
    with cluster.connect(DB) as su:
        made = su.execute("SELECT count(*) FROM idempotency.partitions WHERE range_to > now()").fetchone()[0]
        if made < 2:
            result.violation(f"attacker: the claim recreated {made} partitions, expected the current one and the premade ones")
        su.execute("INSERT INTO idempotency.records SELECT * FROM keep_rows2 WHERE (scope, key) <> ('attacker3', 'recreate')")
    # A superuser whose search_path has the attacker's schema first: the maintenance functions too.
    with cluster.connect(DB) as su:
        su.execute(path)
        # (The caller's own expressions are qualified: only what the extension runs is under test.)
        for sql in ("SELECT * FROM idem_maintenance()",
                    "SELECT idempotency.premake_partitions(pg_catalog.now() OPERATOR(pg_catalog.+) interval '2 days')",
                    "BEGIN",
                    "SELECT * FROM idem_maintenance(pg_catalog.now() OPERATOR(pg_catalog.+) interval '60 days')",
                    "ROLLBACK",
                    "SELECT outcome FROM idem_claim('su', scope => 'superuser')",
                    "SELECT idem_reset_offset('owner', 'topic', 0, 5)",
                    "SELECT * FROM idempotency.partitions"):
            try:
                su.execute(sql)
                calls += 1
            except psycopg.Error as e:
                result.violation(f"superuser with the malicious search_path: {sql!r}: {e.sqlstate}: {e}")
                if su.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    su.execute("ROLLBACK")
        hits = su.execute("SELECT what, by_user, count(*) FROM evil.hijack_log GROUP BY 1, 2 ORDER BY 1").fetchall()
    checks["hostile calls"] = calls
    checks["hijacks"] = sum(n for _, _, n in hits)
    for what, by, n in hits:
        result.violation(f"search_path hijack: the shadow {what} ran {n} times as {by}")
