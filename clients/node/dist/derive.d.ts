/** The idempotency key of the parts that identify an event, as idem_key(namespace, VARIADIC parts):
 *  the RFC 4122 version-5 UUID (SHA-1) of the namespace and the name "len:part;" per part (length in
 *  UTF-8 bytes), lowercase hyphenated. At least one part. */
export declare function idemKey(namespace: string, ...parts: string[]): string;
/** The value at an RFC 6901 JSON Pointer, null when there is none. */
export declare function jsonPointer(doc: unknown, path: string): unknown;
/** The deepest nesting of arrays and objects a fingerprinted document may have (a scalar is 0 deep, [] 1):
 *  the extension's idem_fingerprint and every client library refuse deeper ones with SQLSTATE 54000. */
export declare const MAX_DEPTH = 100;
/** A document nests arrays and objects deeper than MAX_DEPTH: what idem_fingerprint refuses with 54000. */
export declare class DocumentTooDeepError extends RangeError {
    readonly depth: number;
    readonly code = "54000";
    constructor(depth: number);
}
/** How deeply arrays and objects nest in a JSON value (0 for a scalar), counted without recursion; the
 *  count stops once past `limit`. */
export declare function jsonDepth(value: unknown, limit?: number): number;
/** RFC 8785 (JCS) canonical JSON of a value (the npm canonicalize package). */
export declare function canonicalJSON(value: unknown): string;
/** The request fingerprint of a JSON value, as idem_fingerprint(document, VARIADIC paths): lowercase
 *  hex SHA-256 of the JCS canonical JSON of the whole value (no paths), or of the object mapping each
 *  path (as given) to the value at that JSON Pointer, null where there is none. A document nested deeper
 *  than MAX_DEPTH throws DocumentTooDeepError (code "54000"). */
export declare function fingerprint(document: unknown, paths?: string[]): string;
/** fingerprint() of a JSON text (numbers become doubles, as in JCS). */
export declare function fingerprintText(json: string, paths?: string[]): string;
