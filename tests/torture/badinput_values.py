"""Suite 3 (bad input): the hostile values, the case record and the public functions with their arguments.

The tables of hostile values (one bad argument at a time, the others valid), the kinds of argument each function
takes (FUNCS) and what a case is (Case); badinput_args.py and badinput_cases.py build the cases from them,
suite_badinput.py runs them.
"""
from dataclasses import dataclass, field

import pgtools
import psycopg
from psycopg.adapt import Dumper

from harness import port

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

