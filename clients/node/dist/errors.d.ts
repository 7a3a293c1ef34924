import type { Claim, Lease } from "./types.js";
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
/** err with hb as the heartbeatError of its lease loss (a new LeaseLostError), any other error as is. */
export declare function withHeartbeatError(err: unknown, hb: unknown): unknown;
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
