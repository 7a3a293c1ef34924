#!/usr/bin/env python3
"""Writes clients/vectors.json: idem_key and fingerprint test vectors computed by idempotency_client.derive.

    python clients/python/tools/make_vectors.py           # (re)write clients/vectors.json
    python clients/python/tools/make_vectors.py --check   # exit 1 when the file differs from what it computes

Every language's helpers read the same file; the Python tests check it against the SQL functions
(idem_key, idem_fingerprint) when the installed extension has them.
"""
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "src"))
from idempotency_client.derive import DocumentTooDeep, fingerprint, idem_key  # noqa: E402

OUT = HERE.parents[2] / "vectors.json"

NS_A = "6ba7b811-9dad-11d1-80b4-00c04fd430c8"  # RFC 4122's NAMESPACE_URL
NS_B = "3f1c2a8e-5b7d-4e2a-9c61-0d8e4b7f2a10"  # an arbitrary one

KEY_CASES = [
    (NS_A, ["orders", "42"]),
    (NS_B, ["orders", "42"]),
    (NS_B, ["a;b"]),
    (NS_B, ["a", "b"]),
    (NS_B, ["a:b"]),
    (NS_B, ["1:a;"]),
    (NS_B, ["3:a;b;"]),
    (NS_B, [""]),
    (NS_B, ["", ""]),
    (NS_B, ["é"]),
    (NS_B, ["e\u0301"]),  # same glyph, other bytes: no Unicode normalisation
    (NS_B, ["日本語", "🎉"]),
    (NS_B, ["with space", "tab\tnewline\n"]),
    (NS_B, ["payment", "cust-7", "2024-05-01T10:00:00Z", "EUR", "19.90"]),
    (NS_B, ["x" * 300]),
    (NS_B, ["0"]),
    (NS_B, ["null"]),
]

NESTED = {"z": {"y": 1, "x": [3, {"b": 1, "a": None}]}, "a": "x", "m": {"b": [], "a": {}}}
NUMBERS = {"n": [1.0, 1e21, 1e20, 0.1, 1e-7, 0.000001, -0.0, 100, -1, 1.5e300, 0.30000000000000004,
                 123456789012345678901234567890, 9007199254740993, 9007199254740991, -9007199254740993, 2.5]}
UNICODE = {"s": "é\u0001\n\"\\/€😀\u001f\u007f\u2028", "€": 1, "😀": 2, "ﬁ": 3, "a": 4, "A": 5, "\u0080": 6}
POINTERS = {"a/b": 1, "m~n": 2, "~1": 3, "": 4, "0": "zero", " ": "space",
            "items": [10, {"id": 7}, [1, 2]], "s": "text", "nil": None}

FP_CASES = [
    ({}, []),
    ([], []),
    (None, []),
    ("just a string", []),
    (42, []),
    ({"b": 1, "a": 2}, []),
    ({"a": 2, "b": 1}, []),
    (NESTED, []),
    ([1, "a", None, True, False, {"k": [{}]}], []),
    (NUMBERS, []),
    ({"x": 1.0}, []),
    ({"x": 1}, []),
    ({"x": 1e21}, []),
    ({"x": 0.1}, []),
    (UNICODE, []),
    (NESTED, ["/a"]),
    (NESTED, ["/z/x/1/a"]),
    (NESTED, ["/z/x/1"]),
    (NESTED, ["/missing"]),
    (NESTED, ["/z/x/5"]),
    (NESTED, ["", "/a"]),
    (NESTED, ["/a", "/a"]),
    (NESTED, ["/m", "/z/y", "/a"]),
    (NESTED, ["/z/y", "/a", "/m"]),
    (POINTERS, ["/a~1b", "/m~0n"]),
    (POINTERS, ["/~01"]),
    (POINTERS, ["/"]),
    (POINTERS, ["/0"]),
    (POINTERS, ["/%20", "/ "]),
    (POINTERS, ["/items/0", "/items/1/id", "/items/2/1"]),
    (POINTERS, ["/items/-"]),
    (POINTERS, ["/items/01"]),
    (POINTERS, ["/items/-1"]),
    (POINTERS, ["/items/3"]),
    (POINTERS, ["/s/0"]),
    (POINTERS, ["/nil"]),
    (POINTERS, ["/nil/x"]),
    ({"a~2": 1, "a~": 2, "~": 3}, ["/a~2", "/a~", "/~"]),  # '~' not followed by 0 or 1: taken literally
    ({"order": {"customer": "cust-7", "amount": 19.9, "currency": "EUR", "note": "ignored"}},
     ["/order/customer", "/order/amount", "/order/currency"]),
    (UNICODE, ["/€", "/😀", "/s"]),
    (NUMBERS, ["/n/1", "/n/2", "/n/6"]),
]


def nested(levels, kind="array"):
    """`levels` arrays (or objects {"a": ...}) around the number 1, built without recursion."""
    doc = 1
    for _ in range(levels):
        doc = [doc] if kind == "array" else {"a": doc}
    return doc


# The deepest documents a fingerprint takes (MAX_DEPTH = 100), with and without a path into them.
FP_CASES += [(nested(100), []), (nested(100, "object"), ["/a/a"])]
# Documents every implementation refuses with 54000, written as {"nest": levels, "kind": ...} (a client
# builds the document): one level too deep, and far too deep for any recursive parser or canonicalizer.
REFUSED = [(101, "array", []), (101, "object", []), (101, "array", ["/0"]), (5000, "array", []), (5000, "object", [])]


def compute():
    return {
        "keys": [{"namespace": ns, "parts": parts, "key": idem_key(ns, *parts)} for ns, parts in KEY_CASES],
        "fingerprints": [{"document": doc, "paths": paths, "fingerprint": fingerprint(doc, paths)}
                         for doc, paths in FP_CASES],
        "refused": [{"nest": n, "kind": kind, "paths": paths, "sqlstate": refused(nested(n, kind), paths)}
                    for n, kind, paths in REFUSED],
    }


def refused(doc, paths):
    try:
        fingerprint(doc, paths)
    except DocumentTooDeep as e:
        return e.sqlstate
    raise AssertionError("a document deeper than MAX_DEPTH was fingerprinted")


def render():
    return json.dumps(compute(), ensure_ascii=False, indent=1) + "\n"


def main(argv):
    text = render()
    if argv[1:] == ["--check"]:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} differs from what make_vectors.py computes", file=sys.stderr)
            return 1
        print(f"{OUT}: up to date")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
