import type { PoolClient } from "pg";
import type { ClaimOptions, Connectable, GuardResult, Lease, Queryable } from "./types.js";
import { FailedError, HandlerError } from "./errors.js";
export * from "./types.js";
export { IdempotencyError, ClaimRefusedError, InProgressError, FailedError, MismatchError, LeaseLostError, HandlerError, PermanentError, permanent, sqlState, isRetryable, isTerminal, } from "./errors.js";
export { claim, refusal, leaseOf, complete, fail, heartbeat, errorPayload, keepAlive } from "./calls.js";
export type { KeepAlive } from "./calls.js";
export { idempotency, idempotencyOf } from "./http.js";
export type { HttpIdempotency, HttpMode, HttpOptions, Route } from "./http.js";
export { KeyFieldError, MAX_KEY_LENGTH, parseKey, pathMatches, problem, replayedResponse, requestFingerprint, storedResponse } from "./httpwire.js";
export type { StoredResponse } from "./httpwire.js";
export * from "./derive.js";
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
