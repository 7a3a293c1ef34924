"""Suite 3 (bad input): the hostile calls of each kind of argument (identifiers, ttls, fingerprints,
booleans, tokens, documents, key arrays, payload and token arrays, partitions, offsets, generations,
resets, timestamps), one bad argument at a time, the others valid; badinput_cases.py adds the states, the
contexts and the settings.
"""
from badinput_values import IDENT_BAD, IDENT_VALID, OK, PG_REJECTS, TEN_MB, TOKEN_BAD, TTL_BAD, TTL_VALID, Raw


class ArgCases:
    """The cases of each kind of argument (the methods _kind_<kind>, named by the kinds of FUNCS); the builder
    (badinput_cases.Builder) provides base(), add() and the state `st` and batch limit `limit`."""

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

