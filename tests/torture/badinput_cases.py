"""Suite 3 (bad input): the builder of the cases: the valid base call of each function, then for each
argument the cases of its kind (badinput_args.py), the calls that are wrong for the key's state, every
function in hostile contexts, and settings that make ordinary values hostile.
"""
import pgtools

from badinput_args import ArgCases
from badinput_values import CONSUMER, FUNCS, OK, OUTSIDER, PARALLEL_GUC, Case, Raw, RawBytes, _args


class Builder(ArgCases):
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

