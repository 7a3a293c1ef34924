"""Suite 3: bad input, table-driven.

For every public function, hostile calls built from tables of hostile values, one bad argument at a
time (the others valid), plus hostile contexts (no privilege, read-only transaction, aborted
transaction, wrong types and arity, prepared statements, cursors, exception handlers):

* a call expected to fail must raise an ERROR with the SQLSTATE docs/reference.md's table documents (or, for
  values PostgreSQL itself rejects before the call, PostgreSQL's own SQLSTATE, with a message that is
  not the extension's);
* a hostile value that is valid input (quotes, SQL fragments, format specifiers, 512-byte keys,
  non-control Unicode...) must be accepted and stored byte for byte;
* a writing function in a read-only transaction fails at once with 25006 and the message
  "<function> cannot run in a read-only transaction", whatever its arguments and state;
* every error a call raises reaches the client clean: SQLSTATE not XX000 (internal error), and no
  field (message, detail, hint, context) contains Rust internals ("pgrx", "panic", "backtrace",
  ".rs:", "rust_begin_unwind", "core::", "std::"); the server runs with RUST_BACKTRACE=1, so a
  pgrx backtrace appended to DETAIL would show;
* after every call: no advisory lock of the extension survives the rolled-back subtransaction, the
  session answers SELECT 1 after ROLLBACK, pg_postmaster_start_time() is unchanged, and the row counts
  and digests of idempotency.records and idempotency.offsets (and the partition list) are unchanged.

Every call runs in BEGIN ... ROLLBACK (a successful call is verified inside the transaction, then rolled
back), so the storage stays at the baseline written by the setup.
"""
from dataclasses import dataclass, field

import pgtools
import psycopg
from psycopg.adapt import Dumper

from harness import Cluster, close_quietly, log, port, rust_internals, table_digest

PORT = port(2)
DB = "badinput"
SEQ_DB = "badinput_seq"
OK = "ok"
CONSUMER = "bi_consumer"
OUTSIDER = "bi_outsider"


class Raw(str):
    """A value given as an SQL expression evaluated by the server (10 MB strings, convert_from...)."""


class RawBytes:
    """Bytes sent as a text parameter in binary format: the server's text receive function sees them."""

    def __init__(self, data):
        self.data = data

    def __repr__(self):
        return f"RawBytes({self.data!r})"


class _RawBytesDumper(Dumper):
    format = psycopg.pq.Format.BINARY
    oid = psycopg.postgres.types["text"].oid

    def dump(self, obj):
        return obj.data


@dataclass
class Case:
    fn: str
    label: str
    sql: str
    params: list
    expect: object                       # "ok", a SQLSTATE, or a tuple of acceptable ones
    prelude: list = field(default_factory=list)   # (sql, params) run first in the same transaction
    verify: list = field(default_factory=list)    # (sql, params, expected first row) after an "ok" call
    role: str = None                     # SET LOCAL ROLE before the call
    context: str = "tx"                  # tx | aborted | prepared | cursor | do-block | cte
    pg_rejects: bool = False             # the error must come from PostgreSQL, not the extension
    setting: tuple = None                # (guc, value) SET LOCAL before the call (as the role, if any)
    begin: str = "BEGIN"
    read_only_message: bool = False      # a 25006 must say "<fn> cannot run in a read-only transaction"


# ---------------------------------------------------------------------------------------------------
# Hostile values

TEN_MB = 10 * 1024 * 1024

IDENT_BAD = [
    ("NULL", None, "22004"),
    ("empty string", "", "22023"),
    ("513 ASCII bytes", "k" * 513, "54000"),
    ("257 two-byte characters (514 bytes)", "\u00e9" * 257, "54000"),
    ("511 bytes + one two-byte character (513 bytes)", "k" * 511 + "\u00e9", "54000"),
    ("10 MB", Raw(f"repeat('x', {TEN_MB})"), "54000"),
    ("10 MB of two-byte characters", Raw(f"repeat('\u00e9', {TEN_MB // 2})"), "54000"),
    ("SOH control character", "a\x01b", "22023"),
    ("newline", "a\nb", "22023"),
    ("leading tab", "\tkey", "22023"),
    ("trailing carriage return", "key\r", "22023"),
    ("ANSI escape sequence", "\x1b[31mred", "22023"),
    ("DEL", "a\x7f", "22023"),
    ("C1 control U+0085", "a\u0085b", "22023"),
    ("C1 control U+009B", "\u009b", "22023"),
    ("bell only", "\x07", "22023"),
]

# Rejected by PostgreSQL while evaluating the argument, before the function is called.
PG_REJECTS = [
    ("invalid UTF-8 0xff via convert_from", Raw("convert_from('\\xff'::bytea, 'UTF8')"), "22021"),
    ("truncated UTF-8 sequence via convert_from", Raw("convert_from('\\x6b65e282'::bytea, 'UTF8')"), "22021"),
    ("overlong NUL 0xc0 0x80 via convert_from", Raw("convert_from('\\xc080'::bytea, 'UTF8')"), "22021"),
    ("UTF-16 surrogate 0xed 0xa0 0x80 via convert_from", Raw("convert_from('\\xeda080'::bytea, 'UTF8')"), "22021"),
    ("set_byte-crafted 0xff via convert_from", Raw("convert_from(set_byte('kk'::bytea, 1, 255), 'UTF8')"), "22021"),
    ("E'' string with \\xff", Raw("E'k\\xffk'"), "22021"),
    ("raw bytes 0xff in a binary-format text parameter", RawBytes(b"k\xffk"), "22021"),
    ("NUL character via chr(0)", Raw("'k' || chr(0)"), "54000"),
]

# Hostile but valid: accepted and stored byte for byte.
IDENT_VALID = [
    ("SQL injection", "'; DROP TABLE idempotency.records; --"),
    ("quotes of every kind", "O'Reilly \"quoted\" `back` \u2018curly\u2019"),
    ("DELETE fragment", "x'); DELETE FROM idempotency.offsets; --"),
    ("dollar quotes", "$$; SELECT pg_sleep(10); $$ $body$"),
    ("format() specifiers", "%s %I %L %1$s %%"),
    ("backslashes", "\\x00 \\' \\\\ \\n"),
    ("LIKE wildcards", "%_%"),
    ("regular expression", ".*^$[a-z]+(?=x)|"),
    ("exactly 512 ASCII bytes", "k" * 512),
    ("256 two-byte characters (512 bytes)", "\u00e9" * 256),
    ("4-byte emoji", "\U0001F525\U0001F4A5\U0001F642" * 10),
    ("format characters (zero-width space, RTL override, BOM), not controls", "a\u200bb\u202ec\ufeff"),
    ("whitespace only", "   "),
    ("the word NULL", "NULL"),
    ("psql meta-commands", "\\gexec \\! rm -rf /"),
    ("JSON text", '{"key": [1, 2]}'),
    ("combining accent (distinct from precomposed)", "e\u0301"),
    ("LATIN1 byte 0xe9 decoded by convert_from", Raw("convert_from('\\xe9'::bytea, 'LATIN1')")),
]

TTL_BAD = [
    ("zero", "0", "22023"),
    ("minus one second", "-1 second", "22023"),
    ("minus one month", "-1 mon", "22023"),
    ("one month minus 30 days", "1 mon -30 days", "22023"),
    ("minus one microsecond", "-00:00:00.000001", "22023"),
    ("most negative interval", "-178000000 years", "22023"),
    # Longer than idempotency.max_lease_ttl (a day by default): refused before any time is computed.
    ("100,000,000 years", "100000000 years", "22023"),
    ("largest interval", "178000000 years", "22023"),
    ("2147483647 days", "2147483647 days", "22023"),
    ("ten years", "10 years", "22023"),
    ("a day and a microsecond", "1 day 00:00:00.000001", "22023"),
]
TTL_VALID = [
    ("one microsecond", "00:00:00.000001"),
    ("NULL (idempotency.lease_ttl)", None),
    ("a day (idempotency.max_lease_ttl)", "1 day"),
]

TOKEN_BAD = [
    ("zero", 0, "22023"),
    ("minus one", -1, "22023"),
    ("smallest bigint", -(2**63), "22023"),
]


def _q(s):
    return "'" + s.replace("'", "''") + "'"


# ---------------------------------------------------------------------------------------------------
# Functions: name, arguments (name, kind, SQL type), whether it writes, whether consumers may call it

# The setting that forces parallel workers for every query: renamed in PostgreSQL 16.
PARALLEL_GUC = "force_parallel_mode" if pgtools.pg().version.split()[1].startswith("15") else "debug_parallel_query"

FUNCS = {
    "idem_claim": (["key:ident:text", "ttl:ttl:interval", "scope:ident:text", "fingerprint:fp:text", "wait:bool:boolean"], True, True),
    "idem_complete": (["key:ident:text", "payload:doc:jsonb", "scope:ident:text", "token:token:bigint"], True, True),
    "idem_fail": (["key:ident:text", "error:doc:jsonb", "retryable:bool:boolean", "scope:ident:text", "token:token:bigint"], True, True),
    "idem_heartbeat": (["key:ident:text", "ttl:ttl:interval", "scope:ident:text", "token:token:bigint"], True, True),
    "idem_once": (["key:ident:text", "scope:ident:text"], True, True),
    "idem_status": (["key:ident:text", "scope:ident:text"], False, True),
    "idem_claim_batch": (["keys:keys:text[]", "ttl:ttl:interval", "scope:ident:text"], True, True),
    "idem_complete_batch": (["keys:keys:text[]", "payloads:docs:jsonb[]", "scope:ident:text", "tokens:tokens:bigint[]"], True, True),
    "idem_once_batch": (["keys:keys:text[]", "scope:ident:text"], True, True),
    "idem_record_offset": (["consumer_group:ident:text", "topic:ident:text", "partition:part:integer", "processed_offset:offset:bigint", "generation:gen:bigint"], True, True),
    "idem_next_offset": (["consumer_group:ident:text", "topic:ident:text", "partition:part:integer"], False, True),
    "idem_offsets": (["consumer_group:ident:text", "topic:identopt:text"], False, True),
    "idem_reset_offset": (["consumer_group:ident:text", "topic:ident:text", "partition:part:integer", "next_offset:reset:bigint", "generation:gen:bigint"], True, False),
    "idem_maintenance": (["as_of:asof:timestamptz"], True, False),
    "idempotency.premake_partitions": (["as_of:asof:timestamptz"], True, False),
    "idem_partman_handover": ([], True, False),
}


def _args(fn):
    return [tuple(a.split(":")) for a in FUNCS[fn][0]]


class Builder:
    """Builds the cases; `st` holds the tokens of the keys the setup committed."""

    def __init__(self, st, batch_limit):
        self.st = st
        self.limit = batch_limit
        self.cases = []

    # The valid arguments of each function, for a call that succeeds (with its prelude).
    def base(self, fn):
        st = self.st
        if fn == "idem_claim":
            return {"key": "bi-new", "ttl": "1 minute", "scope": "bi", "fingerprint": None, "wait": True}, []
        if fn == "idem_complete":
            return {"key": "bi-pending", "payload": '{"ok": true}', "scope": "bi", "token": st["bi-pending"]}, []
        if fn == "idem_fail":
            return {"key": "bi-pending", "error": '{"e": 1}', "retryable": True, "scope": "bi", "token": st["bi-pending"]}, []
        if fn == "idem_heartbeat":
            return {"key": "bi-pending", "ttl": "1 minute", "scope": "bi", "token": st["bi-pending"]}, []
        if fn in ("idem_once", "idem_status"):
            return {"key": "bi-new", "scope": "bi"}, []
        if fn == "idem_claim_batch":
            return {"keys": ["bi-b1", "bi-b2"], "ttl": "1 minute", "scope": "bi"}, []
        if fn == "idem_complete_batch":
            pre = [("SELECT count(*) FROM idem_claim_batch(ARRAY['bi-c1','bi-c2'], scope => 'bi')", [])]
            return {"keys": ["bi-c1", "bi-c2"], "payloads": ['{"n": 1}', '{"n": 2}'], "scope": "bi", "tokens": None}, pre
        if fn == "idem_once_batch":
            return {"keys": ["bi-o1", "bi-o2"], "scope": "bi"}, []
        if fn == "idem_record_offset":
            return {"consumer_group": "bi-g", "topic": "bi-t", "partition": 0, "processed_offset": 200, "generation": 5}, []
        if fn == "idem_next_offset":
            return {"consumer_group": "bi-g", "topic": "bi-t", "partition": 0}, []
        if fn == "idem_offsets":
            return {"consumer_group": "bi-g", "topic": None}, []
        if fn == "idem_reset_offset":
            return {"consumer_group": "bi-g", "topic": "bi-t", "partition": 0, "next_offset": 7, "generation": 5}, []
        if fn in ("idem_maintenance", "idempotency.premake_partitions"):
            return {"as_of": Raw("now()")}, []
        return {}, []

    def call(self, fn, args):
        """SQL and parameters of a call with named arguments."""
        parts, params = [], []
        types = {a[0]: a[2] for a in _args(fn)}
        for name, value in args.items():
            if isinstance(value, Raw):
                parts.append(f"{name} => ({value})::{types[name]}")
            elif isinstance(value, RawBytes):
                parts.append(f"{name} => %b")
                params.append(value)
            else:
                parts.append(f"{name} => %s::{types[name]}")
                params.append(value)
        return f"SELECT * FROM {fn}({', '.join(parts)})", params

    def add(self, fn, label, args, expect, prelude=(), verify=(), **kw):
        sql, params = self.call(fn, args)
        self.cases.append(Case(fn, label, sql, params, expect, list(prelude), list(verify), **kw))

    # -------------------------------------------------------------------------------------------
    def build(self):
        for fn in FUNCS:
            base, pre = self.base(fn)
            for name, kind, _ in _args(fn):
                getattr(self, f"_kind_{kind}")(fn, base, pre, name)
            self._state(fn)
            self._contexts(fn, base, pre)
        self._special()
        return self.cases

    def _with(self, base, name, value):
        args = dict(base)
        args[name] = value
        return args

    def _stored(self, fn, args, name, value):
        """Verification that a hostile-but-valid value reached storage byte for byte."""
        if isinstance(value, Raw):
            expr, p = f"({value})", []
        else:
            expr, p = "%s::text", [value]
        if fn in ("idem_claim", "idem_once", "idem_complete", "idem_fail", "idem_heartbeat"):
            key = value if name == "key" else args["key"]
            scope = value if name == "scope" else args["scope"]
            kexpr, kp = (expr, p) if name == "key" else ("%s::text", [key])
            sexpr, sp = (expr, p) if name == "scope" else ("%s::text", [scope])
            return [(f"SELECT count(*) FROM idempotency.records WHERE key = {kexpr} AND scope = {sexpr}", kp + sp, (1,)),
                    (f"SELECT count(*) FROM idem_status({kexpr}, {sexpr})", kp + sp, (1,))]
        if fn in ("idem_record_offset", "idem_reset_offset"):
            g = (expr, p) if name == "consumer_group" else ("%s::text", [args["consumer_group"]])
            t = (expr, p) if name == "topic" else ("%s::text", [args["topic"]])
            return [(f"SELECT count(*) FROM idempotency.offsets WHERE consumer_group = {g[0]} AND topic = {t[0]}", g[1] + t[1], (1,))]
        if fn in ("idem_claim_batch", "idem_once_batch", "idem_complete_batch") and name == "scope":
            return [(f"SELECT count(*) FROM idempotency.records WHERE scope = {expr}", p, (2,))]
        return []

    def _hostile_ident_prelude(self, fn, args, name, value):
        """complete/fail/heartbeat of a hostile key: claim it first in the same transaction."""
        if fn == "idem_complete_batch" and name == "scope":
            sx = f"({value})" if isinstance(value, Raw) else "%s::text"
            return [(f"SELECT count(*) FROM idem_claim_batch(%s::text[], scope => {sx})",
                     [args["keys"]] + ([] if isinstance(value, Raw) else [value]))]
        if fn not in ("idem_complete", "idem_fail", "idem_heartbeat"):
            return []
        key = value if name == "key" else args["key"]
        scope = value if name == "scope" else args["scope"]
        kx = f"({key})" if isinstance(key, Raw) else "%s::text"
        sx = f"({scope})" if isinstance(scope, Raw) else "%s::text"
        p = ([] if isinstance(key, Raw) else [key]) + ([] if isinstance(scope, Raw) else [scope])
        return [(f"SELECT count(*) FROM idem_claim({kx}, scope => {sx})", p)]

    def _kind_ident(self, fn, base, pre, name, optional=False):
        for label, value, code in IDENT_BAD:
            if optional and value is None:
                continue
            self.add(fn, f"{name}: {label}", self._with(base, name, value), code, pre)
        for label, value, code in PG_REJECTS:
            self.add(fn, f"{name}: {label}", self._with(base, name, value), code, pre, pg_rejects=True)
        for label, value in IDENT_VALID:
            args = self._with(base, name, value)
            if fn in ("idem_complete", "idem_fail", "idem_heartbeat"):
                args["token"] = None
            prelude = pre + self._hostile_ident_prelude(fn, args, name, value)
            self.add(fn, f"{name}: {label} (valid)", args, OK, prelude, self._stored(fn, args, name, value))

    def _kind_identopt(self, fn, base, pre, name):
        self._kind_ident(fn, base, pre, name, optional=True)
        self.add(fn, f"{name}: NULL (all topics, valid)", self._with(base, name, None), OK, pre)

    def _kind_ttl(self, fn, base, pre, name):
        for label, value, code in TTL_BAD:
            self.add(fn, f"{name}: {label}", self._with(base, name, value), code, pre)
        for label, value in TTL_VALID:
            self.add(fn, f"{name}: {label} (valid)", self._with(base, name, value), OK, pre)
        self.add(fn, f"{name}: not an interval", self._with(base, name, "soon"), "22007", pre, pg_rejects=True)

    def _kind_fp(self, fn, base, pre, name):
        self.add(fn, f"{name}: 513 bytes", self._with(base, name, "f" * 513), "54000", pre)
        self.add(fn, f"{name}: 10 MB", self._with(base, name, Raw(f"repeat('f', {TEN_MB})")), "54000", pre)
        for label, value, code in PG_REJECTS[:3]:
            self.add(fn, f"{name}: {label}", self._with(base, name, value), code, pre, pg_rejects=True)
        for label, value in IDENT_VALID[:6] + [("empty string", ""), ("control characters (not checked in fingerprints)", "a\x01\n")]:
            self.add(fn, f"{name}: {label} (valid)", self._with(base, name, value), OK, pre)
        self.add(fn, f"{name}: other fingerprint of an existing key (mismatch)",
                 {**base, "key": "bi-fp", "fingerprint": "other"}, OK, pre,
                 [("SELECT outcome FROM idem_claim('bi-fp', scope => 'bi', fingerprint => 'other2')", [], ("mismatch",))])

    def _kind_bool(self, fn, base, pre, name):
        self.add(fn, f"{name}: NULL", self._with(base, name, None), "22004", pre)
        self.add(fn, f"{name}: not a boolean", self._with(base, name, "maybe"), "22P02", pre, pg_rejects=True)

    def _kind_token(self, fn, base, pre, name):
        for label, value, code in TOKEN_BAD:
            self.add(fn, f"{name}: {label}", self._with(base, name, value), code, pre)
        self.add(fn, f"{name}: beyond bigint", self._with(base, name, Raw("9223372036854775808")), "22003", pre, pg_rejects=True)
        self.add(fn, f"{name}: largest bigint (not the holder's)", self._with(base, name, 2**63 - 1), "55006", pre)
        self.add(fn, f"{name}: the token of another key", self._with(base, name, self.st["bi-other"]), "55006", pre)
        self.add(fn, f"{name}: a token never issued", self._with(base, name, 10**15), "55006", pre)

    def _kind_doc(self, fn, base, pre, name):
        big = Raw("jsonb_build_object('x', repeat('x', 1048576))")
        self.add(fn, f"{name}: over max_payload_bytes (1 MB)", self._with(base, name, big), "54000", pre)
        self.add(fn, f"{name}: 10 MB", self._with(base, name, Raw(f"to_jsonb(repeat('x', {TEN_MB}))")), "54000", pre)
        self.add(fn, f"{name}: not JSON", self._with(base, name, "{"), "22P02", pre, pg_rejects=True)
        self.add(fn, f"{name}: \\u0000 escape", self._with(base, name, '"\\u0000"'), "22P05", pre, pg_rejects=True)
        self.add(fn, f"{name}: invalid UTF-8 inside JSON", self._with(base, name, Raw("convert_from('\\x227f22ff22'::bytea, 'UTF8')")), "22021", pre, pg_rejects=True)
        col = "payload" if fn == "idem_complete" else "error"
        key = base["key"]
        for label, doc in [("JSON null", "null"),
                           ("empty object", "{}"),
                           ("numbers beyond double precision", '{"n": 12345678901234567890123.000000000000000000001, "e": 1e400}'),
                           ("unicode and quotes", '{"k": "\\"O\'Reilly\\" \U0001F525 \\u00e9"}'),
                           ("nested 200 levels deep", "[" * 200 + "]" * 200),
                           ("just under 1 MB", Raw("jsonb_build_object('x', repeat('x', 1048000))"))]:
            verify = []
            if fn in ("idem_complete", "idem_fail") and not isinstance(doc, Raw):
                verify = [(f"SELECT {col} = %s::jsonb FROM idempotency.records WHERE scope = 'bi' AND key = %s", [doc, key], (True,))]
            self.add(fn, f"{name}: {label} (valid)", self._with(base, name, doc), OK, pre, verify)

    def _kind_keys(self, fn, base, pre, name):
        lim = self.limit
        bad = [("NULL array", None, "22004"),
               ("NULL element", ["a", None], "22004"),
               ("empty element", ["a", ""], "22023"),
               ("513-byte element", ["a", "k" * 513], "54000"),
               ("newline in an element", ["a", "b\nc"], "22023"),
               ("C1 control element", ["\u0085"], "22023"),
               (f"{lim + 1} keys (over max_batch_keys)", Raw(f"ARRAY(SELECT 'k' || g FROM generate_series(1, {lim + 1}) g)"), "54000"),
               ("10 MB element", Raw(f"ARRAY[repeat('x', {TEN_MB})]"), "54000")]
        for label, value, code in bad:
            self.add(fn, f"{name}: {label}", self._with(base, name, value), code, pre)
        for label, value, code in PG_REJECTS[:2] + PG_REJECTS[5:6]:
            self.add(fn, f"{name}: element {label}", self._with(base, name, Raw(f"ARRAY['a', {value}]")), code, pre, pg_rejects=True)
        self.add(fn, f"{name}: malformed array literal", self._with(base, name, "{a,"), "22P02", pre, pg_rejects=True)
        hostile = [v for _, v in IDENT_VALID if not isinstance(v, Raw)]
        if fn == "idem_complete_batch":
            claim = [("SELECT count(*) FROM idem_claim_batch(%s::text[], scope => 'bi')", [hostile])]
            self.add(fn, f"{name}: hostile keys (valid)", {**base, name: hostile, "payloads": None}, OK, claim,
                     [("SELECT count(*) FROM idempotency.records WHERE scope = 'bi' AND status = 'completed' AND key = ANY(%s::text[])", [hostile], (len(hostile),))])
            self.add(fn, f"{name}: repeated key", {**base, name: ["bi-c1", "bi-c1"], "payloads": None}, "22023", pre)
            self.add(fn, f"{name}: empty array (valid)", {**base, name: [], "payloads": None}, OK, pre)
            many = Raw(f"ARRAY(SELECT 'm' || g FROM generate_series(1, {lim}) g)")
            self.add(fn, f"{name}: exactly max_batch_keys (valid)", {**base, name: many, "payloads": None}, OK,
                     [(f"SELECT count(*) FROM idem_claim_batch({many}, scope => 'bi')", [])])
        else:
            self.add(fn, f"{name}: hostile keys (valid)", self._with(base, name, hostile), OK, pre,
                     [("SELECT count(*) FROM idempotency.records WHERE scope = 'bi' AND key = ANY(%s::text[])", [hostile], (len(hostile),))])
            self.add(fn, f"{name}: repeated key (valid)", self._with(base, name, ["bi-r", "bi-r", "bi-r"]), OK, pre,
                     [("SELECT count(*) FROM idempotency.records WHERE scope = 'bi' AND key = 'bi-r'", [], (1,))])
            self.add(fn, f"{name}: empty array (valid)", self._with(base, name, []), OK, pre)
            self.add(fn, f"{name}: two-dimensional array (valid)", self._with(base, name, Raw("ARRAY[['a2','b2'],['c2','d2']]")), OK, pre)
            self.add(fn, f"{name}: array with lower bound 5 (valid)", self._with(base, name, Raw("'[5:6]={lb5,lb6}'::text[]")), OK, pre)
            self.add(fn, f"{name}: exactly max_batch_keys (valid)", self._with(base, name, Raw(f"ARRAY(SELECT 'm' || g FROM generate_series(1, {lim}) g)")), OK, pre)

    def _kind_docs(self, fn, base, pre, name):
        self.add(fn, f"{name}: fewer payloads than keys", self._with(base, name, ['{"n": 1}']), "22023", pre)
        self.add(fn, f"{name}: more payloads than keys", self._with(base, name, ["1", "2", "3"]), "22023", pre)
        self.add(fn, f"{name}: empty payload array", self._with(base, name, []), "22023", pre)
        self.add(fn, f"{name}: payload element over the limit", self._with(base, name, Raw("ARRAY['1'::jsonb, jsonb_build_object('x', repeat('x', 1048576))]")), "54000", pre)
        self.add(fn, f"{name}: NULL payload element (valid)", self._with(base, name, [None, "{}"]), OK, pre)
        self.add(fn, f"{name}: NULL payload array (valid)", self._with(base, name, None), OK, pre)
        self.add(fn, f"{name}: element nested 200 levels deep (valid)", self._with(base, name, ["[" * 200 + "]" * 200, "1"]), OK, pre)

    def _kind_tokens(self, fn, base, pre, name):
        st = self.st
        self.add(fn, f"{name}: fewer tokens than keys", self._with(base, name, [None]), "22023", pre)
        self.add(fn, f"{name}: more tokens than keys", self._with(base, name, [None, None, None]), "22023", pre)
        self.add(fn, f"{name}: token element zero", self._with(base, name, [0, None]), "22023", pre)
        self.add(fn, f"{name}: token element negative", self._with(base, name, [None, -5]), "22023", pre)
        self.add(fn, f"{name}: the token of another key", self._with(base, name, [st["bi-other"], None]), "55006", pre)
        self.add(fn, f"{name}: NULL token elements (valid)", self._with(base, name, [None, None]), OK, pre)
        self.add(fn, f"{name}: holder's token for a key of another transaction",
                 {**base, "keys": ["bi-pending"], "payloads": None, name: [st["bi-pending"]]}, OK, [])
        self.add(fn, f"{name}: no token for a key of another transaction",
                 {**base, "keys": ["bi-pending"], "payloads": None, name: [None]}, "55006", [])

    def _kind_part(self, fn, base, pre, name):
        self.add(fn, f"{name}: NULL", self._with(base, name, None), "22004", pre)
        self.add(fn, f"{name}: minus one", self._with(base, name, -1), "22023", pre)
        self.add(fn, f"{name}: smallest integer", self._with(base, name, -(2**31)), "22023", pre)
        self.add(fn, f"{name}: beyond integer", self._with(base, name, Raw("2147483648")), "22003", pre, pg_rejects=True)
        self.add(fn, f"{name}: largest integer (valid)", self._with(base, name, 2**31 - 1), OK, pre)

    def _kind_offset(self, fn, base, pre, name):
        self.add(fn, f"{name}: NULL", self._with(base, name, None), "22004", pre)
        self.add(fn, f"{name}: minus one", self._with(base, name, -1), "22023", pre)
        self.add(fn, f"{name}: smallest bigint", self._with(base, name, -(2**63)), "22023", pre)
        self.add(fn, f"{name}: largest bigint", self._with(base, name, 2**63 - 1), "22003", pre)
        self.add(fn, f"{name}: beyond bigint", self._with(base, name, Raw("9223372036854775808")), "22003", pre, pg_rejects=True)
        self.add(fn, f"{name}: largest bigint minus one (valid)", self._with(base, name, 2**63 - 2), OK, pre)
        self.add(fn, f"{name}: below the stored position (valid, false)", self._with(base, name, 3), OK, pre,
                 [("SELECT next_offset FROM idempotency.offsets WHERE consumer_group = 'bi-g' AND topic = 'bi-t' AND partition = 0", [], (101,))])

    def _kind_gen(self, fn, base, pre, name):
        self.add(fn, f"{name}: minus one", self._with(base, name, -1), "22023", pre)
        self.add(fn, f"{name}: smallest bigint", self._with(base, name, -(2**63)), "22023", pre)
        if fn == "idem_reset_offset":
            # The DBA's reset replaces the stored generation, lower ones included (a zombie's huge one).
            check = [("SELECT generation FROM idempotency.offsets WHERE consumer_group = 'bi-g' AND topic = 'bi-t' "
                      "AND partition = 0", [], (4,))]
            self.add(fn, f"{name}: older than the stored generation (valid, replaces it)", self._with(base, name, 4), OK,
                     pre, check)
            self.add(fn, f"{name}: zero (valid)", self._with(base, name, 0), OK, pre)
        else:
            self.add(fn, f"{name}: older than the stored generation", self._with(base, name, 4), "55006", pre)
            self.add(fn, f"{name}: zero (older)", self._with(base, name, 0), "55006", pre)
        self.add(fn, f"{name}: NULL (valid)", self._with(base, name, None), OK, pre)
        self.add(fn, f"{name}: largest bigint (valid)", self._with(base, name, 2**63 - 1), OK, pre)

    def _kind_reset(self, fn, base, pre, name):
        self.add(fn, f"{name}: NULL", self._with(base, name, None), "22004", pre)
        self.add(fn, f"{name}: minus one", self._with(base, name, -1), "22023", pre)
        self.add(fn, f"{name}: smallest bigint", self._with(base, name, -(2**63)), "22023", pre)
        self.add(fn, f"{name}: largest bigint (valid)", self._with(base, name, 2**63 - 1), OK, pre)
        self.add(fn, f"{name}: zero (valid)", self._with(base, name, 0), OK, pre)

    def _kind_asof(self, fn, base, pre, name):
        self.add(fn, f"{name}: NULL", self._with(base, name, None), "22004", pre)
        # Not documented; an infinite timestamp is not a point in time to maintain as of. A prompt
        # ERROR (22008 like the other timestamp overflows, or 22023) is the only acceptable answer.
        self.add(fn, f"{name}: infinity", self._with(base, name, "infinity"), ("22008", "22023"), pre)
        self.add(fn, f"{name}: -infinity", self._with(base, name, "-infinity"), ("22008", "22023"), pre)
        self.add(fn, f"{name}: not a timestamp", self._with(base, name, "tomorrow-ish"), "22007", pre, pg_rejects=True)
        self.add(fn, f"{name}: last representable day", self._with(base, name, "294276-12-31 00:00:00+00"), (OK, "22008"), pre)
        for label, value in [("4713 BC", "4713-11-24 00:00:00+00 BC"), ("year 1", "0001-01-01 00:00:00+00"),
                             ("1900", "1900-01-01"), ("epoch", "epoch"), ("2000-01-01 (partition origin)", "2000-01-01 00:00:00+00"),
                             ("leap day", "2024-02-29 12:00:00+00"), ("leap second notation", "2016-12-31 23:59:60+00"),
                             ("DST change in Europe/Paris", "2025-03-30 02:30:00 Europe/Paris"),
                             ("UTC+14", "2026-01-01 00:00:00+14"), ("UTC-12", "2026-01-01 00:00:00-12"),
                             ("one microsecond before midnight", "2026-06-30 23:59:59.999999+00"),
                             ("year 9999", "9999-12-31 23:59:59+00"), ("year 100000", "100000-01-01 00:00:00+00"),
                             ("now minus 30 days", Raw("now() - interval '30 days'")),
                             ("now plus 30 days", Raw("now() + interval '30 days'")),
                             ("now plus 10 years", Raw("now() + interval '10 years'"))]:
            self.add(fn, f"{name}: {label} (valid)", self._with(base, name, value), OK, pre)

    # -------------------------------------------------------------------------------------------
    def _state(self, fn):
        """Calls that are wrong for the state of the key, not for their arguments."""
        st = self.st
        if fn in ("idem_complete", "idem_fail", "idem_heartbeat"):
            base, _ = self.base(fn)
            def a(key, token):
                return {**base, "key": key, "token": token}
            self.add(fn, "state: key never claimed", a("bi-missing", None), "P0002")
            self.add(fn, "state: key never claimed, with a token", a("bi-missing", st["bi-pending"]), "P0002")
            self.add(fn, "state: key completed", a("bi-completed", None), "55000")
            self.add(fn, "state: key completed, with its token", a("bi-completed", st["bi-completed"]), "55000")
            self.add(fn, "state: key failed", a("bi-failed", None), "55000")
            self.add(fn, "state: key released, with the old token", a("bi-released", st["bi-released"]), "55006")
            self.add(fn, "state: key released, without a token", a("bi-released", None), "55006")
            self.add(fn, "state: key claimed by another transaction, no token", a("bi-pending", None), "55006")
            self.add(fn, "state: key claimed and rolled back in this transaction", a("bi-rb", None), "P0002",
                     [("SAVEPOINT a", []), ("SELECT count(*) FROM idem_claim('bi-rb', scope => 'bi')", []), ("ROLLBACK TO SAVEPOINT a", [])])
            self.add(fn, "state: key claimed in this transaction, scope differs", {**a("bi-x", None), "scope": "bi-other-scope"}, "P0002",
                     [("SELECT count(*) FROM idem_claim('bi-x', scope => 'bi')", [])])
        if fn == "idem_claim":
            self.add(fn, "state: second claim in the same transaction (valid, in_progress)", {"key": "bi-twice", "scope": "bi"}, OK,
                     [("SELECT count(*) FROM idem_claim('bi-twice', scope => 'bi')", [])],
                     [("SELECT outcome FROM idem_claim('bi-twice', scope => 'bi')", [], ("in_progress",))])
            self.add(fn, "state: claim of a failed key (valid, failed)", {"key": "bi-failed", "scope": "bi"}, OK, [],
                     [("SELECT outcome FROM idem_claim('bi-failed', scope => 'bi')", [], ("failed",))])
        if fn == "idem_record_offset":
            self.add(fn, "state: zombie generation on an existing position", {"consumer_group": "bi-g", "topic": "bi-t", "partition": 0,
                                                                              "processed_offset": 10**9, "generation": 1}, "55006")

    CONTEXTS = [
        # (label, context, begin, setting, prelude)
        ("plain transaction", "tx", "BEGIN", None, []),
        ("read-only transaction", "tx", "BEGIN READ ONLY", None, []),
        ("REPEATABLE READ", "tx", "BEGIN ISOLATION LEVEL REPEATABLE READ", None, []),
        ("SERIALIZABLE", "tx", "BEGIN ISOLATION LEVEL SERIALIZABLE", None, []),
        ("SERIALIZABLE READ ONLY DEFERRABLE", "tx", "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE", None, []),
        ("inside an aborted transaction", "aborted", "BEGIN", None, []),
        ("prepared statement", "prepared", "BEGIN", None, []),
        ("through a cursor", "cursor", "BEGIN", None, []),
        ("in a materialized CTE", "cte", "BEGIN", None, []),
        ("error caught by a PL/pgSQL exception handler", "do-block", "BEGIN", None, []),
        ("nested savepoints", "tx", "BEGIN", None, [("SAVEPOINT n1", []), ("SAVEPOINT n2", [])]),
        # Parallel workers forced for every query (force_parallel_mode up to 15, debug_parallel_query from 16).
        (f"{PARALLEL_GUC} = on", "tx", "BEGIN", (PARALLEL_GUC, "on"), []),
        ("lock_timeout = 1ms", "tx", "BEGIN", ("lock_timeout", "1ms"), []),
        ("client_min_messages = debug5", "tx", "BEGIN", ("client_min_messages", "debug5"), []),
        ("work_mem = 64kB", "tx", "BEGIN", ("work_mem", "64kB"), []),
    ]

    def _contexts(self, fn, base, pre):
        """Every function in hostile contexts, as superuser, as a consumer and as a role without the grant."""
        writes, consumer_ok = FUNCS[fn][1], FUNCS[fn][2]
        for role in (None, CONSUMER, OUTSIDER):
            allowed = role is None or (role == CONSUMER and consumer_ok)
            plain = (OK if fn != "idem_partman_handover" else "55000") if allowed else "42501"
            for label, context, begin, setting, extra in self.CONTEXTS:
                args, prelude = base, pre
                expect = plain
                if "READ ONLY" in begin and allowed and writes:
                    # Every writing function refuses a read-only transaction at once, before looking
                    # at its arguments or its state (even with nothing to create or drop, even without
                    # pg_partman), naming itself.
                    expect = "25006"
                if "READ ONLY" in begin and fn == "idem_complete_batch":
                    # no claim possible in a read-only transaction: complete another's key by token
                    args, prelude = {**base, "keys": ["bi-pending"], "payloads": None,
                                     "tokens": [self.st["bi-pending"]]}, []
                if context == "aborted":
                    expect = "25P02"
                if context == "do-block":
                    expect = OK
                who = {None: "superuser", CONSUMER: "consumer role", OUTSIDER: "role without idempotency_consumer"}[role]
                sql, params = self.call(fn, args)
                self.cases.append(Case(fn, f"context: {label}, {who}", sql, params, expect, prelude + extra, [],
                                       role=role, context=context, setting=setting, begin=begin,
                                       read_only_message=expect == "25006"))
        # Wrong arity and types: PostgreSQL finds no such function.
        sql, params = self.call(fn, base)
        self.cases.append(Case(fn, "context: unknown named argument", sql[:-1] + (", " if base else "") + "nonsense => 1)", params, "42883", pre))
        self.cases.append(Case(fn, "context: one positional argument too many",
                               f"SELECT * FROM {fn}({', '.join(['NULL'] * len(_args(fn)) + ['1'])})", [], "42883"))
        if _args(fn):
            self.cases.append(Case(fn, "context: an integer as first argument", f"SELECT * FROM {fn}(42)", [], "42883"))
            self.add(fn, "context: NULL first argument through a prepared statement",
                     self._with(base, _args(fn)[0][0], None), "22004", pre, context="prepared")

    def _special(self):
        # Settings that make ordinary values hostile.
        self.add("idem_claim", "setting: max_key_bytes = 1, key of 2 bytes", {"key": "ab", "scope": "b"}, "54000",
                 setting=("idempotency.max_key_bytes", "1"))
        self.add("idem_claim", "setting: max_key_bytes = 1MB, 100 kB key of random text", {"key": Raw("(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 3200) g)"), "scope": "bi"},
                 (OK, "54000"), setting=("idempotency.max_key_bytes", "1MB"))
        self.add("idem_complete", "setting: max_payload_bytes = 0, payload {}", {"key": "bi-pending", "payload": "{}", "scope": "bi",
                                                                                  "token": self.st["bi-pending"]}, "54000",
                 setting=("idempotency.max_payload_bytes", "0"))
        self.add("idem_claim_batch", "setting: max_batch_keys = 1, two keys", {"keys": ["a", "b"], "scope": "bi"}, "54000",
                 setting=("idempotency.max_batch_keys", "1"))
        # Native: a superuser-only setting, refused at SET. The SQL edition (no library to define it) accepts a
        # consumer's SET and only lets it tighten a limit: the claim goes on under the table's limit.
        self.add("idem_claim", "setting: max_key_bytes set by the consumer role", {"key": "a", "scope": "bi"},
                 OK if pgtools.sql_edition() else "42501", role=CONSUMER, setting=("idempotency.max_key_bytes", "1MB"))
        self.add("idem_claim", "setting: max_attempts = 1, takeover of an expired lease (valid, failed)", {"key": "bi-expired", "scope": "bi"}, OK,
                 [("SELECT count(*) FROM idem_claim('bi-expired', ttl => '1 microsecond', scope => 'bi')", []), ("SELECT pg_sleep(0.01)", [])],
                 setting=("idempotency.max_attempts", "1"))


# ---------------------------------------------------------------------------------------------------


def setup(conn):
    conn.execute(f"DROP ROLE IF EXISTS {CONSUMER}")
    conn.execute(f"DROP ROLE IF EXISTS {OUTSIDER}")
    conn.execute(f"CREATE ROLE {CONSUMER}")
    conn.execute(f"CREATE ROLE {OUTSIDER}")
    conn.execute(f"GRANT idempotency_consumer TO {CONSUMER}")
    st = {}
    for key in ("bi-pending", "bi-other", "bi-completed", "bi-failed", "bi-released"):
        st[key] = conn.execute("SELECT token FROM idem_claim(%s, ttl => '1 hour', scope => 'bi')", (key,)).fetchone()[0]
    conn.execute("SELECT idem_complete('bi-completed', '{\"done\": 1}', scope => 'bi', token => %s)", (st["bi-completed"],))
    conn.execute("SELECT idem_fail('bi-failed', '{\"e\": 1}', retryable => false, scope => 'bi', token => %s)", (st["bi-failed"],))
    conn.execute("SELECT idem_fail('bi-released', '{\"e\": 2}', scope => 'bi', token => %s)", (st["bi-released"],))
    conn.execute("SELECT idem_claim('bi-fp', scope => 'bi', fingerprint => 'one')")
    conn.execute("SELECT idem_record_offset('bi-g', 'bi-t', 0, 100, 5)")
    return st


# Errors of this run whose fields were checked for Rust internals, and those that had some.
ERRORS = {"inspected": 0, "unclean": 0}


def run(install, opts, result):
    ERRORS.update(inspected=0, unclean=0)
    cluster = Cluster(install, PORT, conf=["track_functions = 'all'"])
    cluster.start()
    try:
        cluster.create_db(DB)
        with cluster.connect(DB) as admin:
            st = setup(admin)
            # (The SQL edition keeps its limits in the table idempotency.settings, not in the library's GUCs.)
            limit = int(admin.execute("SELECT max_batch_keys FROM idempotency.settings" if pgtools.sql_edition()
                                      else "SHOW idempotency.max_batch_keys").fetchone()[0])
            start = admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
            baseline = table_digest(admin)
            cases = Builder(st, limit).build()
            sess = _session(cluster)
            per_fn, failures, pg_rejected = {}, [], 0
            for case in cases:
                per_fn[case.fn] = per_fn.get(case.fn, 0) + 1
                sess, problems = _run_case(cluster, sess, case)
                if case.pg_rejects and not problems:
                    pg_rejected += 1
                if admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0] != start:
                    problems.append("the postmaster restarted")
                    start = admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
                digest = table_digest(admin)
                if digest != baseline:
                    problems.append(f"storage changed: {baseline[0]}/{baseline[2]} rows -> {digest[0]}/{digest[2]} rows, "
                                    f"partitions {'changed' if digest[4] != baseline[4] else 'same'}")
                    baseline = digest
                for p in problems:
                    failures.append(f"{case.fn} [{case.label}]: {p}")
            sess.close()
            seq = _sequences(cluster)
            failures += seq
        for f in failures:
            result.violation(f)
        result.figures.update({
            "hostile calls": len(cases),
            "functions covered": len(per_fn),
            "fewest calls to one function": f"{min(per_fn.values())} ({min(per_fn, key=per_fn.get)})",
            "calls per function": ", ".join(f"{k} {v}" for k, v in sorted(per_fn.items())),
            "expected to fail": sum(1 for c in cases if c.expect != OK),
            "valid hostile values accepted and verified": sum(1 for c in cases if c.expect == OK),
            "rejected by PostgreSQL before the call (22021 invalid UTF-8, 54000 NUL, type errors)": pg_rejected,
            "sequence checks": 2,
            "errors inspected for Rust internals and XX000": ERRORS["inspected"],
            "errors with Rust internals or XX000 (violations)": ERRORS["unclean"],
            "violations": len(failures),
        })
        log(f"{len(cases)} hostile calls to {len(per_fn)} functions, {len(failures)} violations")
    finally:
        cluster.stop()


def _session(cluster):
    s = cluster.connect(DB, timeout_ms=20000)
    s.adapters.register_dumper(RawBytes, _RawBytesDumper)
    s.execute("SET temp_file_limit = '64MB'")
    return s


def _inline(sess, sql, params):
    """The call with its parameters inlined as literals (for a DO block)."""
    return psycopg.ClientCursor(sess).mogrify(sql, params) if params else sql


def _call(sess, case):
    if case.setting and case.role:
        sess.execute(f"SET LOCAL {case.setting[0]} = '{case.setting[1]}'")
    if case.context == "prepared":
        sess.execute(case.sql, case.params, prepare=True)
    elif case.context == "cursor":
        cur = sess.cursor(name="hostile_cursor")
        try:
            cur.execute(case.sql, case.params)
            cur.fetchall()
        finally:
            if sess.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                cur.close()
    elif case.context == "cte":
        sess.execute(f"WITH x AS MATERIALIZED ({case.sql}) SELECT count(*) FROM x", case.params)
    elif case.context == "do-block":
        sess.execute("DO $do$ BEGIN PERFORM * FROM (" + _inline(sess, case.sql, case.params) +
                     ") AS x; EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'caught %', SQLSTATE; END $do$")
    else:
        sess.execute(case.sql, case.params)


def _run_case(cluster, sess, case):
    """Runs one case; returns the (possibly new) session and the problems found."""
    problems = []
    pid = sess.info.backend_pid
    outcome, message = None, ""
    try:
        sess.execute(case.begin)
        if case.setting and not case.role:
            sess.execute(f"SET LOCAL {case.setting[0]} = '{case.setting[1]}'")
        for sql, params in case.prelude:
            sess.execute(sql, params)
        if case.context == "aborted":
            try:
                sess.execute("SELECT 1/0")
            except psycopg.Error:
                pass
        else:
            held = sess.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                                "AND locktype = 'advisory'").fetchone()[0]
            if case.role:
                sess.execute(f"SET LOCAL ROLE {case.role}")
            sess.execute("SAVEPOINT hostile")
        try:
            _call(sess, case)
            outcome = OK
        except psycopg.Error as e:
            outcome = e.sqlstate or "connection"
            message = e.diag.message_primary or (str(e).splitlines() or [""])[0]
            if sess.broken:
                raise
            unclean = rust_internals(e)
            ERRORS["inspected"] += 1
            ERRORS["unclean"] += bool(unclean)
            for p in unclean:
                problems.append(f"error {outcome} not clean: {p}")
        expect = case.expect if isinstance(case.expect, tuple) else (case.expect,)
        if outcome not in expect:
            problems.append(f"expected {'/'.join(expect)}, got {outcome}" + (f": {message}" if message else ""))
        if outcome == OK and case.verify:
            if case.role:
                sess.execute("RESET ROLE")
            for sql, params, want in case.verify:
                got = sess.execute(sql, params).fetchone()
                if got != tuple(want):
                    problems.append(f"accepted, but verification {sql!r} gave {got}, expected {tuple(want)}")
        if outcome == "25006" and case.read_only_message and not (
                message.startswith(case.fn) and message.endswith("cannot run in a read-only transaction")):
            problems.append(f"25006 without the function's own message "
                            f"('{case.fn} cannot run in a read-only transaction'): {message!r}")
        if outcome != OK and case.pg_rejects and message.startswith("idempotency:"):
            problems.append(f"expected PostgreSQL to reject the value before the call, but the extension did: {message}")
        if outcome != OK and case.context != "aborted":
            # A call that raised an error wrote nothing and holds nothing once its subtransaction is gone.
            sess.execute("ROLLBACK TO SAVEPOINT hostile")
            if case.role:
                sess.execute("RESET ROLE")
            leaked = sess.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                                  "AND locktype = 'advisory'").fetchone()[0]
            if leaked != held:
                problems.append(f"{leaked - held} advisory locks of the failed call still held after ROLLBACK TO SAVEPOINT")
        sess.execute("ROLLBACK")
        if sess.execute("SELECT 1").fetchone()[0] != 1 or sess.info.backend_pid != pid:
            problems.append("the session did not survive")
    except psycopg.Error as e:
        problems.append(f"the session broke: {type(e).__name__}: {e}")
        close_quietly(sess)
        cluster.wait_ready(DB)
        sess = _session(cluster)
    return sess, problems


def _sequences(cluster):
    """Hostile sequences of valid calls, in a database of their own (they commit)."""
    problems = []

    def unclean(what, e):
        found = rust_internals(e)
        ERRORS["inspected"] += 1
        ERRORS["unclean"] += bool(found)
        return [f"sequence [{what}]: error {e.sqlstate} not clean: {p}" for p in found]
    cluster.create_db(SEQ_DB)
    with cluster.connect(SEQ_DB) as c:
        # Aging the data with a future as_of, then premaking that future again in the same session:
        # a later claim must still find (or create) the partition of today.
        c.execute("SELECT * FROM idem_maintenance(now() + interval '30 days')")
        c.execute("SELECT idempotency.premake_partitions(now() + interval '30 days')")
        try:
            out = c.execute("SELECT outcome FROM idem_claim('after-aging')").fetchone()[0]
            if out != "claimed":
                problems.append(f"sequence [claim after maintenance/premake as of now()+30 days]: outcome {out}")
        except psycopg.Error as e:
            problems.append(f"sequence [claim after idem_maintenance(now()+30 days) and premake_partitions(now()+30 days) "
                            f"in the same session]: expected claimed, got {e.sqlstate}: {str(e).splitlines()[0]}")
            problems += unclean("claim after aging", e)
    with cluster.connect(SEQ_DB) as c:
        # The same claim from a fresh session works: the partition is missing only for the first one.
        try:
            c.execute("SELECT outcome FROM idem_claim('fresh-session')").fetchone()
        except psycopg.Error as e:
            problems.append(f"sequence [claim from a fresh session]: {e.sqlstate}: {e}")
            problems += unclean("claim from a fresh session", e)
    return problems
