/** The default longest key, in characters (printable ASCII), as Stripe's. */
export declare const MAX_KEY_LENGTH = 255;
/** The Idempotency-Key field is not one sf-string of 1 to maxLength characters. */
export declare class KeyFieldError extends Error {
    constructor(message: string);
}
/** The key of an Idempotency-Key field value: an RFC 8941 Item whose bare item is a String (parameters
 *  parsed and ignored), not empty, at most maxLength characters. Throws a KeyFieldError otherwise. */
export declare function parseKey(field: string, maxLength?: number): string;
/** A segment "*" matches one non-empty segment, a last segment "**" any rest (none included). */
export declare function pathMatches(pattern: string, path: string): boolean;
/** The default request fingerprint: hex SHA-256 of the method, LF, the request target as received (path
 *  and query), LF, and the body. */
export declare function requestFingerprint(method: string, target: string, body: Buffer): string;
/** The JSON document stored for a response. */
export interface StoredResponse {
    status: number;
    headers: [string, string][];
    body?: string;
    body_base64?: string;
}
/** The status, the headers named in `keep` (names lowercased, in keep's order; `header(name)` gives a
 *  response header's values), and the body as text when it is UTF-8 without NUL (jsonb cannot hold one),
 *  else as base64. */
export declare function storedResponse(status: number, header: (name: string) => string[], body: Buffer, keep: string[]): StoredResponse;
/** A stored response's status, headers (with idempotent-replayed: true) and body. */
export declare function replayedResponse(doc: StoredResponse): {
    status: number;
    headers: [string, string][];
    body: Buffer;
};
/** The RFC 9457 document of a problem code: type base+code and the case's title, or, without a base,
 *  about:blank and the status phrase; a `code` member names the case either way. */
export declare function problem(code: string, base?: string, detail?: string): {
    status: number;
    body: Buffer;
};
