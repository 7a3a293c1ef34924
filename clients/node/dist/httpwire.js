// What the HTTP middleware (http.ts) does without a server: the Idempotency-Key field as an RFC 8941
// sf-string, routes by method and path, the default request fingerprint, the stored form of a response,
// and the RFC 9457 problem documents it answers with. The same contract as clients/python and clients/go
// (clients/http-vectors.json; docs/http.md). Re-exported by index.ts.
import { createHash } from "node:crypto";
/** The default longest key, in characters (printable ASCII), as Stripe's. */
export const MAX_KEY_LENGTH = 255;
/** The Idempotency-Key field is not one sf-string of 1 to maxLength characters. */
export class KeyFieldError extends Error {
    constructor(message) {
        super(message);
        this.name = "KeyFieldError";
    }
}
const isDigit = (c) => c >= "0" && c <= "9";
const isAlpha = (c) => (c >= "a" && c <= "z") || (c >= "A" && c <= "Z");
/** The sf-string starting at s[i] (a '"') and the index after it. */
function sfString(s, i) {
    let out = "";
    for (i++; i < s.length; i++) {
        const c = s[i];
        if (c === "\\") {
            if (s[i + 1] !== '"' && s[i + 1] !== "\\")
                throw new KeyFieldError("a backslash must escape '\"' or '\\'");
            out += s[++i];
        }
        else if (c === '"') {
            return [out, i + 1];
        }
        else if (c < " " || c > "~") {
            throw new KeyFieldError("a string holds printable ASCII characters only");
        }
        else {
            out += c;
        }
    }
    throw new KeyFieldError("the string has no closing '\"'");
}
/** Skips the bare item of a parameter value at s[i]; the index after it. */
function skipBareItem(s, i) {
    const c = s[i] ?? "";
    if (c === '"')
        return sfString(s, i)[1];
    if (c === "?") {
        if (s[i + 1] !== "0" && s[i + 1] !== "1")
            throw new KeyFieldError("a boolean is ?0 or ?1");
        return i + 2;
    }
    if (c === ":") {
        const m = /^:[A-Za-z0-9+/=]*:/.exec(s.slice(i));
        if (!m)
            throw new KeyFieldError("a byte sequence is base64 between two ':'");
        return i + m[0].length;
    }
    if (c === "-" || isDigit(c)) {
        const m = /^-?([0-9]*)(\.([0-9]*))?/.exec(s.slice(i));
        const whole = m[1], frac = m[3];
        if (!whole)
            throw new KeyFieldError("a number needs a digit");
        if (m[2] === undefined ? whole.length > 15 : whole.length > 12 || !frac || frac.length > 3) {
            throw new KeyFieldError(m[2] === undefined ? "an integer has at most 15 digits"
                : "a decimal has 1 to 12 digits, '.', and 1 to 3 digits");
        }
        return i + m[0].length;
    }
    if (isAlpha(c) || c === "*")
        return i + /^[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*/.exec(s.slice(i))[0].length;
    throw new KeyFieldError("a parameter value must be a string, number, token, byte sequence or boolean");
}
/** The key of an Idempotency-Key field value: an RFC 8941 Item whose bare item is a String (parameters
 *  parsed and ignored), not empty, at most maxLength characters. Throws a KeyFieldError otherwise. */
export function parseKey(field, maxLength = MAX_KEY_LENGTH) {
    const s = field;
    let i = 0;
    while (s[i] === " ")
        i++;
    if (s[i] !== '"')
        throw new KeyFieldError("Idempotency-Key must be a quoted string (RFC 8941 sf-string)");
    let key;
    [key, i] = sfString(s, i);
    while (s[i] === ";") {
        i++;
        while (s[i] === " ")
            i++;
        if (!/^[a-z*]/.test(s.slice(i, i + 1))) {
            throw new KeyFieldError("a parameter key starts with a lowercase letter or '*'");
        }
        i += /^[a-z*][a-z0-9_\-.*]*/.exec(s.slice(i))[0].length;
        if (s[i] === "=")
            i = skipBareItem(s, i + 1);
    }
    while (s[i] === " ")
        i++;
    if (i !== s.length)
        throw new KeyFieldError("Idempotency-Key must be a single string");
    if (key === "")
        throw new KeyFieldError("Idempotency-Key is empty");
    if (key.length > maxLength)
        throw new KeyFieldError(`Idempotency-Key is longer than ${maxLength} characters`);
    return key;
}
/** A segment "*" matches one non-empty segment, a last segment "**" any rest (none included). */
export function pathMatches(pattern, path) {
    const want = pattern.split("/"), have = path.split("/");
    for (let n = 0; n < want.length; n++) {
        if (want[n] === "**" && n === want.length - 1)
            return true;
        if (n >= have.length || !(want[n] === have[n] || (want[n] === "*" && have[n] !== "")))
            return false;
    }
    return want.length === have.length;
}
/** The default request fingerprint: hex SHA-256 of the method, LF, the request target as received (path
 *  and query), LF, and the body. */
export function requestFingerprint(method, target, body) {
    return createHash("sha256").update(`${method}\n`).update(Buffer.from(`${target}\n`, "latin1")).update(body)
        .digest("hex");
}
/** The status, the headers named in `keep` (names lowercased, in keep's order; `header(name)` gives a
 *  response header's values), and the body as text when it is UTF-8 without NUL (jsonb cannot hold one),
 *  else as base64. */
export function storedResponse(status, header, body, keep) {
    const doc = { status, headers: [] };
    for (const name of keep)
        for (const v of header(name))
            doc.headers.push([name.toLowerCase(), v]);
    const text = body.toString("utf8");
    if (Buffer.from(text, "utf8").equals(body) && !text.includes("\u0000"))
        doc.body = text;
    else
        doc.body_base64 = body.toString("base64");
    return doc;
}
/** A stored response's status, headers (with idempotent-replayed: true) and body. */
export function replayedResponse(doc) {
    const body = doc.body !== undefined ? Buffer.from(doc.body, "utf8") : Buffer.from(doc.body_base64 ?? "", "base64");
    return { status: doc.status, headers: [...doc.headers, ["idempotent-replayed", "true"]], body };
}
const PROBLEMS = {
    "idempotency-key-missing": [400, "Idempotency-Key is missing", "This operation requires an Idempotency-Key header."],
    "idempotency-key-invalid": [400, "Idempotency-Key is invalid", null],
    "idempotency-key-in-use": [409, "A request is outstanding for this Idempotency-Key",
        "A request with the same Idempotency-Key is being processed; retry later."],
    "idempotency-key-reused": [422, "Idempotency-Key is already used",
        "This Idempotency-Key was used with a different request; use a new key."],
    "request-too-large": [413, "Request body too large", null],
    "idempotency-lease-lost": [409, "The request's lease was lost",
        "Another attempt took this Idempotency-Key over; retry to read its outcome."],
    "idempotency-key-failed": [500, "Idempotency-Key failed",
        "Every attempt of this request failed; send it again with a new Idempotency-Key."],
};
const PHRASES = { 400: "Bad Request", 409: "Conflict", 413: "Content Too Large",
    422: "Unprocessable Content", 500: "Internal Server Error" };
/** The RFC 9457 document of a problem code: type base+code and the case's title, or, without a base,
 *  about:blank and the status phrase; a `code` member names the case either way. */
export function problem(code, base, detail) {
    const [status, title, defaultDetail] = PROBLEMS[code];
    const doc = { type: base ? base + code : "about:blank", title: base ? title : PHRASES[status], status,
        detail: detail || defaultDetail || title, code };
    return { status, body: Buffer.from(JSON.stringify(doc)) };
}
