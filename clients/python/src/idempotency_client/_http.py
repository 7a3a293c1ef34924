"""What the HTTP middleware (idempotency_client.asgi) does without a server: the Idempotency-Key field as an RFC
8941 sf-string, routes by method and path, the default request fingerprint, the stored form of a response, and
the RFC 9457 problem documents it answers with. The same contract as clients/go and clients/node
(clients/http-vectors.json; docs/http.md)."""
from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

ONE_TRANSACTION = "one-transaction"
TWO_TRANSACTIONS = "two-transactions"
MODES = (ONE_TRANSACTION, TWO_TRANSACTIONS)

MAX_KEY_LENGTH = 255          # characters of a key (printable ASCII), as Stripe's
MAX_BODY_BYTES = 1 << 20      # a request body over it is refused with 413 before the handler runs
KEEP_HEADERS = ("content-type", "location")
DEFAULT_SCOPE = "http"


class KeyFieldError(ValueError):
    """The Idempotency-Key field is not one sf-string of 1 to max_length characters."""


# ---- RFC 8941: an Item whose bare item is a String; its parameters are parsed and ignored

_KEY_FIRST = re.compile(r"[a-z*]")
_KEY_REST = re.compile(r"[a-z0-9_\-.*]*")
_TOKEN = re.compile(r"[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*")
_NUMBER = re.compile(r"-?([0-9]+)(\.([0-9]*))?")
_BYTES = re.compile(r":[A-Za-z0-9+/=]*:")


def _string(s: str, i: int) -> Tuple[str, int]:
    """The sf-string starting at s[i] (a '"'), and the index after it."""
    out = []
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            if i + 1 >= len(s) or s[i + 1] not in '"\\':
                raise KeyFieldError("a backslash must escape '\"' or '\\'")
            out.append(s[i + 1])
            i += 2
        elif c == '"':
            return "".join(out), i + 1
        elif not " " <= c <= "~":
            raise KeyFieldError("a string holds printable ASCII characters only")
        else:
            out.append(c)
            i += 1
    raise KeyFieldError("the string has no closing '\"'")


def _bare_item(s: str, i: int) -> int:
    """Skips the bare item of a parameter value at s[i]; returns the index after it."""
    c = s[i] if i < len(s) else ""
    if c == '"':
        return _string(s, i)[1]
    if c == "?":
        if s[i + 1:i + 2] not in ("0", "1"):
            raise KeyFieldError("a boolean is ?0 or ?1")
        return i + 2
    if c == ":":
        m = _BYTES.match(s, i)
        if not m:
            raise KeyFieldError("a byte sequence is base64 between two ':'")
        return m.end()
    if c == "-" or c.isdigit():
        m = _NUMBER.match(s, i)
        if not m:
            raise KeyFieldError("a number needs a digit")
        whole, frac = m.group(1), m.group(3)
        if m.group(2) is None:
            if len(whole) > 15:
                raise KeyFieldError("an integer has at most 15 digits")
        elif len(whole) > 12 or not frac or len(frac) > 3:
            raise KeyFieldError("a decimal has 1 to 12 digits, '.', and 1 to 3 digits")
        return m.end()
    m = _TOKEN.match(s, i)
    if not m:
        raise KeyFieldError("a parameter value must be a string, number, token, byte sequence or boolean")
    return m.end()


def parse_key(field: str, max_length: int = MAX_KEY_LENGTH) -> str:
    """The key of an Idempotency-Key field value: an RFC 8941 Item whose bare item is a String (parameters are
    parsed and ignored), not empty, at most ``max_length`` characters. KeyFieldError otherwise."""
    s, i = field, 0
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s) or s[i] != '"':
        raise KeyFieldError("Idempotency-Key must be a quoted string (RFC 8941 sf-string)")
    key, i = _string(s, i)
    while i < len(s) and s[i] == ";":
        i += 1
        while i < len(s) and s[i] == " ":
            i += 1
        if not _KEY_FIRST.match(s, i):
            raise KeyFieldError("a parameter key starts with a lowercase letter or '*'")
        i = _KEY_REST.match(s, i + 1).end()
        if i < len(s) and s[i] == "=":
            i = _bare_item(s, i + 1)
    while i < len(s) and s[i] == " ":
        i += 1
    if i != len(s):
        raise KeyFieldError("Idempotency-Key must be a single string")
    if not key:
        raise KeyFieldError("Idempotency-Key is empty")
    if len(key) > max_length:
        raise KeyFieldError(f"Idempotency-Key is longer than {max_length} characters")
    return key


# ---- routes

@dataclass(frozen=True)
class Route:
    """Requests the middleware handles: ``method`` ("*": any) and a path ``pattern`` whose segment ``*`` matches
    one non-empty segment and whose last segment ``**`` matches any rest, none included. ``require``: a request
    without Idempotency-Key gets 400. ``mode``: ONE_TRANSACTION / TWO_TRANSACTIONS, None for the middleware's."""

    method: str
    pattern: str
    require: bool = False
    mode: Optional[str] = None

    def __post_init__(self):
        if self.mode not in (None, *MODES):
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if not self.pattern.startswith("/"):
            raise ValueError(f"a route pattern starts with '/': {self.pattern!r}")

    def matches(self, method: str, path: str) -> bool:
        return (self.method == "*" or self.method.upper() == method.upper()) and path_matches(self.pattern, path)


DEFAULT_ROUTES = (Route("POST", "/**"), Route("PATCH", "/**"))


def path_matches(pattern: str, path: str) -> bool:
    want, have = pattern.split("/"), path.split("/")
    for n, seg in enumerate(want):
        if seg == "**" and n == len(want) - 1:
            return True
        if n >= len(have) or not (seg == have[n] or (seg == "*" and have[n] != "")):
            return False
    return len(want) == len(have)


def find_route(routes: Iterable[Route], method: str, path: str) -> Optional[Route]:
    return next((r for r in routes if r.matches(method, path)), None)


# ---- fingerprints and stored responses

def request_fingerprint(method: str, target: str, body: bytes) -> str:
    """Hex SHA-256 of the method, LF, the request target as received (path and query), LF, and the body."""
    return hashlib.sha256(method.encode() + b"\n" + target.encode("latin-1") + b"\n" + body).hexdigest()


def stored_response(status: int, headers: Sequence[Tuple[str, str]], body: bytes, keep: Iterable[str]) -> dict:
    """The JSON document stored for a response: its status, the headers named in ``keep`` (names lowercased, in
    keep's order), and the body as text when it is UTF-8 without NUL (jsonb cannot hold one), else base64."""
    doc = {"status": status, "headers": [[k.lower(), v] for k in keep for n, v in headers if n.lower() == k.lower()]}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\x00" not in text:
        doc["body"] = text
    else:
        doc["body_base64"] = base64.b64encode(body).decode("ascii")
    return doc


def replayed_response(doc: dict) -> Tuple[int, List[Tuple[str, str]], bytes]:
    """(status, headers, body) of a stored response, with ``Idempotent-Replayed: true`` added."""
    body = doc["body"].encode("utf-8") if "body" in doc else base64.b64decode(doc.get("body_base64", ""))
    headers = [(n, v) for n, v in doc.get("headers", [])] + [("idempotent-replayed", "true")]
    return int(doc["status"]), headers, body


# ---- answers (RFC 9457 problem documents)

PROBLEMS = {
    "idempotency-key-missing": (400, "Idempotency-Key is missing",
                                "This operation requires an Idempotency-Key header."),
    "idempotency-key-invalid": (400, "Idempotency-Key is invalid", None),
    "idempotency-key-in-use": (409, "A request is outstanding for this Idempotency-Key",
                               "A request with the same Idempotency-Key is being processed; retry later."),
    "idempotency-key-reused": (422, "Idempotency-Key is already used",
                               "This Idempotency-Key was used with a different request; use a new key."),
    "request-too-large": (413, "Request body too large", None),
    "idempotency-lease-lost": (409, "The request's lease was lost",
                               "Another attempt took this Idempotency-Key over; retry to read its outcome."),
    "idempotency-key-failed": (500, "Idempotency-Key failed",
                               "Every attempt of this request failed; send it again with a new Idempotency-Key."),
}

PHRASES = {400: "Bad Request", 409: "Conflict", 413: "Content Too Large", 422: "Unprocessable Content",
           500: "Internal Server Error"}


def problem(code: str, base: Optional[str], detail: Optional[str] = None,
            retry_after: Optional[int] = None) -> Tuple[int, List[Tuple[str, str]], bytes]:
    """(status, headers, body) of the problem ``code``: ``type`` is ``base`` + code and ``title`` the case's, or,
    without a base, ``about:blank`` and the status phrase (RFC 9457 4.2.1); a ``code`` member names the case."""
    status, title, default_detail = PROBLEMS[code]
    doc = {"type": base + code if base else "about:blank", "title": title if base else PHRASES[status],
           "status": status, "detail": detail or default_detail or title, "code": code}
    headers = [("content-type", "application/problem+json")]
    if retry_after is not None:
        headers.append(("retry-after", str(retry_after)))
    return status, headers, json.dumps(doc).encode()


def retry_after_seconds(expires_at, now, default: int) -> int:
    """Whole seconds until a lease ends (at least 1), or ``default`` when its end is unknown."""
    if expires_at is None:
        return default
    return max(1, math.ceil((expires_at - now).total_seconds()))
