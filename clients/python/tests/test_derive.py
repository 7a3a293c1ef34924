"""idem_key and fingerprint: the contract's properties, clients/vectors.json, and the SQL functions."""
import json
import pathlib
import subprocess
import sys
import uuid

import psycopg
import pytest

from idempotency_client import canonical_json, fingerprint, idem_key
from idempotency_client.derive import key_name, resolve_pointer, MISSING

HERE = pathlib.Path(__file__).resolve()
VECTORS = HERE.parents[2] / "vectors.json"
MAKE = HERE.parents[1] / "tools" / "make_vectors.py"
NS = "3f1c2a8e-5b7d-4e2a-9c61-0d8e4b7f2a10"


def test_key_name_bytes():
    assert key_name("orders", "42") == b"6:orders;2:42;"
    assert key_name("a;b") == b"3:a;b;"
    assert key_name("é") == b"2:\xc3\xa9;"


def test_key_is_uuid5_of_the_name():
    k = idem_key(NS, "orders", "42")
    u = uuid.UUID(k)
    assert u.version == 5 and k == str(u) and k == k.lower()
    assert k == str(uuid.uuid5(uuid.UUID(NS), "6:orders;2:42;"))
    assert idem_key(uuid.UUID(NS), "orders", "42") == k


def test_parts_are_unambiguous():
    assert idem_key(NS, "a;b") != idem_key(NS, "a", "b")
    assert idem_key(NS, "a:b") != idem_key(NS, "a", "b")
    assert idem_key(NS, "") != idem_key(NS, "", "")
    assert idem_key(NS, "e\u0301") != idem_key(NS, "é")  # bytes, no normalisation


def test_key_errors():
    with pytest.raises(ValueError):
        idem_key(NS)
    with pytest.raises(TypeError):
        idem_key(NS, "a", None)
    with pytest.raises(TypeError):
        idem_key(NS, 42)
    with pytest.raises(ValueError):
        idem_key("not-a-uuid", "a")


def test_fingerprint_ignores_key_order_and_formatting():
    a = json.loads('{"b": 1, "a": {"y": [1, 2.0], "x": "é"}}')
    b = json.loads('{"a":{"x":"\\u00e9","y":[1,2]},"b":1.0}')
    assert fingerprint(a) == fingerprint(b)
    assert canonical_json(a) == '{"a":{"x":"é","y":[1,2]},"b":1}'.encode()
    assert fingerprint(a) != fingerprint({"b": 1, "a": {"y": [2, 1], "x": "é"}})  # arrays keep order


def test_fingerprint_over_paths():
    doc = {"order": {"customer": "c7", "amount": 19.9}, "trace": "abc"}
    other = {"order": {"customer": "c7", "amount": 19.9}, "trace": "xyz"}
    paths = ["/order/customer", "/order/amount"]
    assert fingerprint(doc, paths) == fingerprint(other, paths)
    assert fingerprint(doc) != fingerprint(other)
    # a missing value is JSON null; duplicate paths collapse
    assert fingerprint({"a": None}, ["/a"]) == fingerprint({}, ["/a"])
    assert fingerprint(doc, ["/trace", "/trace"]) == fingerprint(doc, ["/trace"])
    assert fingerprint(doc, [""]) != fingerprint(doc)  # {"": doc} is not doc


def test_pointers():
    doc = {"a/b": 1, "m~n": 2, "": 3, "items": [10, 11]}
    assert resolve_pointer(doc, "/a~1b") == 1
    assert resolve_pointer(doc, "/m~0n") == 2
    assert resolve_pointer(doc, "/") == 3
    assert resolve_pointer(doc, "/items/1") == 11
    for p in ("/items/-", "/items/01", "/items/-1", "/items/2", "/nope", "/a~1b/x"):
        assert resolve_pointer(doc, p) is MISSING, p
    assert resolve_pointer({"a~2": 5}, "/a~2") == 5 and resolve_pointer({"a~": 6}, "/a~") == 6  # as in SQL
    for bad in ("a", "items/0", "~1"):
        with pytest.raises(ValueError):
            fingerprint(doc, [bad])
    with pytest.raises(TypeError):
        fingerprint(doc, "/a")


def test_numbers_follow_jcs():
    assert canonical_json([1.0, 1e21, 1e20, 0.1, 1e-7, -0.0]) == b"[1,1e+21,100000000000000000000,0.1,1e-7,0]"
    # beyond 2**53 an integer is a double, as in the database
    assert canonical_json(2**53 + 1) == b"9007199254740992"


def test_vectors_file_is_current():
    r = subprocess.run([sys.executable, str(MAKE), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    assert len(data["keys"]) >= 15 and len(data["fingerprints"]) >= 30
    for v in data["keys"]:
        assert idem_key(v["namespace"], *v["parts"]) == v["key"]
    for v in data["fingerprints"]:
        assert fingerprint(v["document"], v["paths"]) == v["fingerprint"]


def _require_function(conn, name):
    """The SQL function must exist: the extension these tests run against (0.3.0 and later) has it, so a
    missing one fails the test instead of leaving the vectors unchecked."""
    version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()
    n = conn.execute("SELECT count(*) FROM pg_proc WHERE proname = %s", (name,)).fetchone()[0]
    assert n > 0, f"the installed extension (version {version and version[0]}) has no {name}(): " \
                  "the vectors cannot be checked against SQL"


def test_vectors_agree_with_sql_idem_key(connect):
    conn = connect()
    _require_function(conn, "idem_key")
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    for v in data["keys"]:
        (k,) = conn.execute("SELECT idem_key(%s::uuid, VARIADIC %s::text[])", (v["namespace"], v["parts"])).fetchone()
        assert k == v["key"], v


def test_vectors_agree_with_sql_idem_fingerprint(connect):
    conn = connect()
    _require_function(conn, "idem_fingerprint")
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    bad = []
    for v in data["fingerprints"]:
        (fp,) = conn.execute("SELECT idem_fingerprint(%s::jsonb, VARIADIC %s::text[])",
                             (json.dumps(v["document"]), v["paths"])).fetchone()
        if fp != v["fingerprint"]:
            bad.append(v)
    assert not bad, bad


def _nested(levels, kind):
    doc = 1
    for _ in range(levels):
        doc = [doc] if kind == "array" else {"a": doc}
    return doc


def test_deep_documents_are_refused_with_54000():
    from idempotency_client import MAX_DEPTH, DocumentTooDeep
    from idempotency_client.derive import depth

    assert MAX_DEPTH == 100
    assert depth(1) == 0 and depth([]) == 1 and depth({"a": [1, {"b": []}], "c": {}}) == 4
    assert len(fingerprint(_nested(MAX_DEPTH, "array"))) == 64
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    assert len(data["refused"]) >= 4
    for v in data["refused"]:
        with pytest.raises(DocumentTooDeep) as e:
            fingerprint(_nested(v["nest"], v["kind"]), v["paths"])
        assert e.value.sqlstate == v["sqlstate"] == "54000"


def test_refused_vectors_agree_with_sql(connect):
    conn = connect()
    _require_function(conn, "idem_fingerprint")
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    for v in data["refused"]:
        text = ("[" * v["nest"] + "1" + "]" * v["nest"]) if v["kind"] == "array" \
            else ('{"a":' * v["nest"] + "1" + "}" * v["nest"])
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT idem_fingerprint(%s::jsonb, VARIADIC %s::text[])", (text, v["paths"]))
        assert e.value.sqlstate == v["sqlstate"], v
        conn.rollback()
