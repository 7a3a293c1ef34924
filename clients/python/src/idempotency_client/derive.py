"""Key and fingerprint helpers: the same values as the extension's idem_key and idem_fingerprint.

The contract (issue 15, item 4):

* ``idem_key(namespace, *parts)``: the RFC 4122 version-5 UUID (SHA-1) of ``namespace`` and the name bytes
  made of, for each part in order, the decimal length of its UTF-8 bytes, ``:``, the UTF-8 bytes, ``;``
  (``['orders', '42']`` -> ``6:orders;2:42;``), as lowercase hyphenated text. The length prefix makes
  the encoding unambiguous: ``('a;b',)`` and ``('a', 'b')`` give different keys.
* ``fingerprint(document, paths=())``: the lowercase hex SHA-256 of the RFC 8785 (JCS) canonical JSON of
  the document, or, with paths, of the object mapping each path (as given) to the value at that RFC 6901
  JSON Pointer, JSON null where there is none.

* A document whose arrays and objects nest deeper than ``MAX_DEPTH`` (100; a scalar is 0 deep, ``[]`` 1) is
  refused with :class:`DocumentTooDeep` (``sqlstate`` ``54000``), as the SQL function refuses it.

Canonical JSON comes from the ``rfc8785`` package. Numbers are IEEE doubles as in JCS: a Python int
outside +-(2**53 - 1) is converted to the nearest double first (as the database does with a jsonb number),
so it loses precision instead of raising.
"""
from __future__ import annotations

import hashlib
import uuid
from typing import Any, Iterable, Mapping, Sequence, Union

import rfc8785

__all__ = ["idem_key", "key_name", "fingerprint", "canonical_json", "resolve_pointer", "MISSING",
           "MAX_DEPTH", "DocumentTooDeep", "depth"]

_SAFE_INT = 2**53 - 1

#: The deepest nesting of arrays and objects a fingerprinted document may have (the extension's too).
MAX_DEPTH = 100


class DocumentTooDeep(ValueError):
    """A document nests arrays and objects deeper than MAX_DEPTH: what idem_fingerprint refuses with 54000."""

    sqlstate = "54000"

    def __init__(self, depth: int):
        super().__init__(f"document nests arrays and objects more than {MAX_DEPTH} deep (the limit of a fingerprint)")
        self.depth = depth  # at least this deep


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply arrays and objects nest in a JSON value (0 for a scalar), counted without recursion; the
    count stops once past ``limit`` (the caller refuses such a document anyway)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        d += 1
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((c, d) for c in children)
    return deepest


def key_name(*parts: str) -> bytes:
    """The name bytes of idem_key: ``len:utf8;`` for each part."""
    if not parts:
        raise ValueError("idem_key needs at least one part")
    out = bytearray()
    for i, part in enumerate(parts):
        if part is None:
            raise TypeError(f"idem_key: part {i} is None")
        if not isinstance(part, str):
            raise TypeError(f"idem_key: part {i} is {type(part).__name__}, not str (convert it explicitly)")
        b = part.encode("utf-8")
        out += str(len(b)).encode("ascii") + b":" + b + b";"
    return bytes(out)


def idem_key(namespace: Union[uuid.UUID, str], *parts: str) -> str:
    """A UUID v5 key from a namespace UUID and the event's identifying parts (strings)."""
    ns = namespace if isinstance(namespace, uuid.UUID) else uuid.UUID(str(namespace))
    # uuid.uuid5 hashes the UTF-8 encoding of a str name; key_name's bytes are valid UTF-8 (length prefixes,
    # ':' and ';' around each part's own UTF-8), so decoding and re-encoding gives back the same bytes.
    return str(uuid.uuid5(ns, key_name(*parts).decode("utf-8")))


class _Missing:
    def __repr__(self):
        return "MISSING"


MISSING = _Missing()


def _normalise(value: Any) -> Any:
    """JSON value with ints beyond the IEEE-double-exact range turned into floats (as jsonb -> double)."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        return value if -_SAFE_INT <= value <= _SAFE_INT else float(value)
    if isinstance(value, Mapping):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    try:  # decimal.Decimal and other numbers
        import decimal

        if isinstance(value, decimal.Decimal):
            return _normalise(int(value)) if value == value.to_integral_value() and abs(value) <= _SAFE_INT \
                else float(value)
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def canonical_json(document: Any) -> bytes:
    """RFC 8785 canonical JSON (UTF-8 bytes) of a JSON value (dict, list, str, int, float, bool, None)."""
    return rfc8785.dumps(_normalise(document))


def _tokens(pointer: str) -> list:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"not a JSON Pointer (RFC 6901): {pointer!r} (must be empty or start with '/')")
    # '~1' -> '/', then '~0' -> '~'; a '~' followed by anything else stays as it is (the SQL function does
    # the same, so both agree on such pointers instead of one of them raising).
    return [raw.replace("~1", "/").replace("~0", "~") for raw in pointer[1:].split("/")]


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at an RFC 6901 JSON Pointer, or MISSING. Array indexes are ``0`` or digits without a
    leading zero; ``-`` (past the end) and anything else has no value."""
    value = document
    for token in _tokens(pointer):
        if isinstance(value, Mapping):
            if token not in value:
                return MISSING
            value = value[token]
        elif isinstance(value, (list, tuple)):
            if not token.isascii() or not token.isdigit() or (len(token) > 1 and token[0] == "0"):
                return MISSING
            index = int(token)
            if index >= len(value):
                return MISSING
            value = value[index]
        else:
            return MISSING
    return value


def fingerprint(document: Any, paths: Union[Sequence[str], Iterable[str]] = ()) -> str:
    """Request fingerprint: hex SHA-256 of the canonical JSON of the document, or of
    ``{path: value at path (null when absent)}`` over the given JSON Pointers."""
    if isinstance(paths, str):
        raise TypeError("paths is a sequence of JSON Pointers, not one string")
    deepest = depth(document)
    if deepest > MAX_DEPTH:
        raise DocumentTooDeep(deepest)
    paths = list(paths)
    if paths:
        selected = {}
        for p in paths:
            v = resolve_pointer(document, p)
            selected[p] = None if v is MISSING else v
        target = selected
    else:
        target = document
    return hashlib.sha256(canonical_json(target)).hexdigest()
