import type { PoolClient, QueryResult } from "pg";
export declare const VERSION = "0.1.0";
export declare const DEFAULT_SCOPE = "default";
export type Outcome = "claimed" | "completed" | "in_progress" | "failed" | "mismatch";
/** What the calls need: a pg.Pool, pg.Client or PoolClient. On a Pool every call commits by itself. */
export interface Queryable {
    query(text: string, values?: unknown[]): Promise<QueryResult<any>>;
}
/** What withTransaction and guard need: a pg.Pool (a connection per transaction). */
export interface Connectable {
    connect(): Promise<PoolClient>;
}
export interface ClaimOptions {
    /** default "default" */
    scope?: string;
    /** lease length in milliseconds; default the server's idempotency.lease_ttl */
    ttlMs?: number;
    /** request fingerprint (see fingerprint()); a different one for the same key is a MismatchError */
    fingerprint?: string;
    /** false: answer in_progress at once instead of waiting for another open transaction (default true) */
    wait?: boolean;
}
export interface Claim {
    key: string;
    scope: string;
    outcome: Outcome;
    /** fencing token (bigint, as a decimal string), null when none */
    token: string | null;
    attempts: number;
    /** stored result (completed) or stored error (failed); null when none */
    payload: unknown;
    expiresAt: Date | null;
}
/** A claimed key, for the calls that follow the claim. token null: claimed in this transaction. */
export interface Lease {
    key: string;
    scope: string;
    token: string | null;
}
export interface GuardResult<T = unknown> {
    /** the handler's result, or the stored result of an earlier run */
    result: T;
    /** true: a duplicate, the handler did not run */
    replayed: boolean;
    attempts: number;
}
export declare class IdempotencyError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
/** The claim did not give the key to the caller; `claim` says why. */
export declare class ClaimRefusedError extends IdempotencyError {
    readonly claim: Claim;
    constructor(claim: Claim);
}
/** Another consumer holds a live lease on the key: redeliver later. */
export declare class InProgressError extends ClaimRefusedError {
}
/** The key failed terminally: `claim.payload` is the stored error. Dead-letter the message. */
export declare class FailedError extends ClaimRefusedError {
}
/** The key exists with a different fingerprint (same key, different request). */
export declare class MismatchError extends ClaimRefusedError {
}
/** 55006: the lease was taken over or released; the fencing token is no longer the key's. `cause` is
 *  pg's 55006 error. `heartbeatError`, from withLease, is the last heartbeat that failed for another
 *  reason (a connection error, a timeout) with no successful heartbeat after it: often why the lease
 *  ran out; undefined when none failed. */
export declare class LeaseLostError extends IdempotencyError {
    readonly op: string;
    readonly lease: Lease;
    readonly heartbeatError?: unknown | undefined;
    constructor(op: string, lease: Lease, cause: unknown, heartbeatError?: unknown | undefined);
}
/** The handler failed; its error is `cause`. `outcome` is idem_fail's answer ("released": another
 *  attempt may claim the key; "failed": terminal), or null when recording the failure itself failed
 *  (`recordError`, e.g. a LeaseLostError). */
export declare class HandlerError extends IdempotencyError {
    readonly key: string;
    readonly outcome: "released" | "failed" | null;
    readonly recordError: unknown;
    constructor(key: string, cause: unknown, outcome: "released" | "failed" | null, recordError?: unknown);
    /** true when no later delivery will run the handler (the key is failed) */
    get terminal(): boolean;
}
/** Marks a handler's error as terminal: the key is recorded as failed (idem_fail retryable => false). */
export declare class PermanentError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
export declare function permanent(err: unknown): PermanentError;
/** The SQLSTATE of a database error (pg's DatabaseError, or one inside `cause`), else undefined. */
export declare function sqlState(err: unknown): string | undefined;
/** true for a serialization failure (40001) or a deadlock (40P01): run the whole transaction again. */
export declare function isRetryable(err: unknown): boolean;
/** true when the key is terminally failed: a FailedError from the claim, or a HandlerError that made it so. */
export declare function isTerminal(err: unknown): boolean;
/** idem_claim. The outcome is returned as is (see refusal() for the error of a refused claim). */
export declare function claim(db: Queryable, key: string, opts?: ClaimOptions): Promise<Claim>;
/** The error of a refused claim (in_progress, failed, mismatch), null for claimed and completed. */
export declare function refusal(c: Claim): ClaimRefusedError | null;
export declare function leaseOf(c: Claim): Lease;
/** idem_complete with the lease's token (none for a claim of this transaction). */
export declare function complete(db: Queryable, lease: Lease, result?: unknown): Promise<void>;
/** idem_fail: "released" (another attempt may claim the key) or "failed" (terminal). */
export declare function fail(db: Queryable, lease: Lease, error: unknown, retryable?: boolean): Promise<"released" | "failed">;
/** idem_heartbeat: extends the lease, returns its new end. */
export declare function heartbeat(db: Queryable, lease: Lease, ttlMs?: number): Promise<Date>;
/** How a failure is stored: {"error": message}. */
export declare function errorPayload(err: unknown): {
    error: string;
};
export type Isolation = "read committed" | "repeatable read" | "serializable";
export interface TransactionOptions {
    isolation?: Isolation;
    /** attempts in all for 40001 / 40P01 (default 5) */
    maxAttempts?: number;
}
/** Runs fn in a transaction on a connection of the pool and commits; a serialization failure or a
 *  deadlock (in fn or at commit) rolls back and runs fn again, up to maxAttempts in all. Any other error
 *  rolls back and is thrown as is. fn must not commit or roll back. */
export declare function withTransaction<T>(pool: Connectable, fn: (client: PoolClient) => Promise<T>, opts?: TransactionOptions): Promise<T>;
export type TxHandler<T> = (client: Queryable) => Promise<T>;
/** The guard inside the caller's open transaction (one-transaction mode):
 *  - idem_claim; a duplicate returns the stored result (replayed) without running the handler; a
 *    refused claim throws InProgressError, FailedError or MismatchError;
 *  - claimed: the handler runs in a savepoint; its result is stored with idem_complete;
 *  - the handler throws: rolled back to the savepoint, the failure recorded with idem_fail (terminal for
 *    a PermanentError), and a HandlerError thrown: COMMIT so that the failure is recorded;
 *  - a serialization failure or deadlock from the handler is thrown as is: roll back and run the whole
 *    transaction again.
 *  The caller commits: the handler's writes and the stored result commit together, or not at all. */
export declare function guardInTransaction<T>(client: Queryable, key: string, handler: TxHandler<T>, opts?: ClaimOptions): Promise<GuardResult<T>>;
export interface GuardOptions extends ClaimOptions, TransactionOptions {
}
/** guardInTransaction in a transaction of its own on a pool connection, committed; retried on
 *  40001 / 40P01. Throws HandlerError (after committing the recorded failure), InProgressError,
 *  FailedError, MismatchError, or the database's error. */
export declare function guard<T>(pool: Connectable, key: string, handler: TxHandler<T>, opts?: GuardOptions): Promise<GuardResult<T>>;
export interface EachMessageOptions<P> extends GuardOptions {
    /** the idempotency key of a message (a header, or idemKey over its identifying fields) */
    key: (payload: P) => string;
    /** the business logic, inside the transaction: write through `client` */
    handler: (payload: P, client: Queryable) => Promise<unknown>;
    /** a message whose key is (or just became) terminally failed: route it to a dead-letter topic. When
     *  absent, the FailedError / HandlerError is thrown. */
    onDeadLetter?: (payload: P, err: FailedError | HandlerError) => Promise<void> | void;
}
/** A kafkajs eachMessage handler (or any consumer callback) guarded in one-transaction mode: returns
 *  when the message was processed now or before (a replay), or dead-lettered; throws otherwise, so that
 *  the consumer redelivers (InProgressError, a released HandlerError, a database error). */
export declare function eachMessage<P>(pool: Connectable, opts: EachMessageOptions<P>): (payload: P) => Promise<void>;
export interface LeaseOptions extends ClaimOptions {
    /** lease length (default 30 s) */
    ttlMs?: number;
    /** pause between heartbeats (default ttlMs / 3; 0 turns them off) */
    heartbeatMs?: number;
    /** hears of heartbeats that failed for another reason than a lost lease (retried at the next beat).
     *  Set or not, the last such failure (with no successful heartbeat after it) becomes the
     *  `heartbeatError` of the LeaseLostError thrown if the lease is then found lost. */
    onHeartbeatError?: (err: unknown) => void;
}
export type LeaseHandler<T> = (lease: Lease, signal: AbortSignal) => Promise<T>;
/** The guard of two-transaction mode, for side effects outside the database. `db` should be a pg.Pool
 *  (each call its own transaction; heartbeats on any connection).
 *  - idem_claim commits a lease and a fencing token; a duplicate returns the stored result (replayed);
 *    a refused claim throws InProgressError, FailedError or MismatchError;
 *  - while the handler runs, idem_heartbeat extends the lease every heartbeatMs; a heartbeat that finds
 *    the lease lost aborts `signal` and withLease throws that LeaseLostError;
 *  - the result is stored with idem_complete and the token (a LeaseLostError if lost meanwhile);
 *  - a heartbeat that fails otherwise (onHeartbeatError hears of it) is tried again at the next beat;
 *    if the lease is then lost, the LeaseLostError's `heartbeatError` is the last such failure;
 *  - a thrown error is recorded with idem_fail (released, or failed for a PermanentError) and rethrown
 *    as a HandlerError. */
export declare function withLease<T>(db: Queryable, key: string, handler: LeaseHandler<T>, opts?: LeaseOptions): Promise<GuardResult<T>>;
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
