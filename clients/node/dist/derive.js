// Keys and fingerprints, the same values as the extension's idem_key and idem_fingerprint (re-exported by
// index.ts).
import { createHash } from "node:crypto";
import canonicalize from "canonicalize";
function uuidBytes(u) {
    const hex = u.replace(/-/g, "");
    if (!/^[0-9a-fA-F]{32}$/.test(hex))
        throw new TypeError(`not a UUID: ${JSON.stringify(u)}`);
    return Buffer.from(hex, "hex");
}
/** The idempotency key of the parts that identify an event, as idem_key(namespace, VARIADIC parts):
 *  the RFC 4122 version-5 UUID (SHA-1) of the namespace and the name "len:part;" per part (length in
 *  UTF-8 bytes), lowercase hyphenated. At least one part. */
export function idemKey(namespace, ...parts) {
    if (parts.length === 0)
        throw new TypeError("idemKey needs at least one part");
    const name = [];
    for (const p of parts) {
        if (typeof p !== "string")
            throw new TypeError(`idemKey parts must be strings, got ${p === null ? "null" : typeof p}`);
        const b = Buffer.from(p, "utf8");
        name.push(Buffer.from(`${b.length}:`), b, Buffer.from(";"));
    }
    const h = createHash("sha1").update(uuidBytes(namespace)).update(Buffer.concat(name)).digest();
    h[6] = (h[6] & 0x0f) | 0x50;
    h[8] = (h[8] & 0x3f) | 0x80;
    const x = h.subarray(0, 16).toString("hex");
    return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}
const ARRAY_INDEX = /^(0|[1-9][0-9]*)$/;
const own = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
/** The value at an RFC 6901 JSON Pointer, null when there is none. */
export function jsonPointer(doc, path) {
    if (path === "")
        return doc;
    if (!path.startsWith("/"))
        throw new TypeError(`not a JSON Pointer (empty or starting with '/'): ${JSON.stringify(path)}`);
    let v = doc;
    for (const raw of path.slice(1).split("/")) {
        const tok = raw.replace(/~1/g, "/").replace(/~0/g, "~");
        if (Array.isArray(v)) {
            if (!ARRAY_INDEX.test(tok) || Number(tok) >= v.length)
                return null;
            v = v[Number(tok)];
        }
        else if (v !== null && typeof v === "object") {
            if (!own(v, tok))
                return null;
            v = v[tok];
        }
        else {
            return null;
        }
    }
    return v === undefined ? null : v;
}
/** The deepest nesting of arrays and objects a fingerprinted document may have (a scalar is 0 deep, [] 1):
 *  the extension's idem_fingerprint and every client library refuse deeper ones with SQLSTATE 54000. */
export const MAX_DEPTH = 100;
/** A document nests arrays and objects deeper than MAX_DEPTH: what idem_fingerprint refuses with 54000. */
export class DocumentTooDeepError extends RangeError {
    depth;
    code = "54000";
    constructor(depth) {
        super(`document nests arrays and objects more than ${MAX_DEPTH} deep (the limit of a fingerprint)`);
        this.depth = depth;
        this.name = "DocumentTooDeepError";
    }
}
/** How deeply arrays and objects nest in a JSON value (0 for a scalar), counted without recursion; the
 *  count stops once past `limit`. */
export function jsonDepth(value, limit = MAX_DEPTH) {
    let deepest = 0;
    const stack = [[value, 0]];
    while (stack.length > 0) {
        const [v, d] = stack.pop();
        if (v === null || typeof v !== "object")
            continue;
        deepest = Math.max(deepest, d + 1);
        if (deepest > limit)
            return deepest;
        for (const c of Array.isArray(v) ? v : Object.values(v))
            stack.push([c, d + 1]);
    }
    return deepest;
}
/** The same count on a JSON text, before it is parsed (JSON.parse recurses). */
function textDepth(json) {
    let depth = 0, deepest = 0, inString = false, escaped = false;
    for (let i = 0; i < json.length; i++) {
        const c = json.charCodeAt(i);
        if (inString) {
            if (escaped)
                escaped = false;
            else if (c === 0x5c)
                escaped = true;
            else if (c === 0x22)
                inString = false;
            continue;
        }
        if (c === 0x22)
            inString = true;
        else if (c === 0x5b || c === 0x7b)
            deepest = Math.max(deepest, ++depth);
        else if ((c === 0x5d || c === 0x7d) && depth > 0)
            depth--;
    }
    return deepest;
}
/** RFC 8785 (JCS) canonical JSON of a value (the npm canonicalize package). */
export function canonicalJSON(value) {
    const s = canonicalize(value);
    if (s === undefined)
        throw new TypeError("the value has no JSON representation");
    return s;
}
/** The request fingerprint of a JSON value, as idem_fingerprint(document, VARIADIC paths): lowercase
 *  hex SHA-256 of the JCS canonical JSON of the whole value (no paths), or of the object mapping each
 *  path (as given) to the value at that JSON Pointer, null where there is none. A document nested deeper
 *  than MAX_DEPTH throws DocumentTooDeepError (code "54000"). */
export function fingerprint(document, paths = []) {
    const depth = jsonDepth(document);
    if (depth > MAX_DEPTH)
        throw new DocumentTooDeepError(depth);
    let v = document;
    if (paths.length > 0) {
        const sel = Object.create(null);
        for (const p of paths)
            sel[p] = jsonPointer(document, p);
        v = sel;
    }
    return createHash("sha256").update(canonicalJSON(v), "utf8").digest("hex");
}
/** fingerprint() of a JSON text (numbers become doubles, as in JCS). */
export function fingerprintText(json, paths = []) {
    const depth = textDepth(json);
    if (depth > MAX_DEPTH)
        throw new DocumentTooDeepError(depth);
    return fingerprint(JSON.parse(json), paths);
}
