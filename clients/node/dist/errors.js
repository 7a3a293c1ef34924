// ------------------------------------------------------------------------------------------------
// Errors
export class IdempotencyError extends Error {
    constructor(message, options) {
        super(message, options);
        this.name = new.target.name;
    }
}
/** The claim did not give the key to the caller; `claim` says why. */
export class ClaimRefusedError extends IdempotencyError {
    claim;
    constructor(claim) {
        super(`key ${JSON.stringify(claim.key)} (scope ${JSON.stringify(claim.scope)}) is ${claim.outcome} after ` +
            `${claim.attempts} attempts${claim.payload == null ? "" : ": " + JSON.stringify(claim.payload)}`);
        this.claim = claim;
    }
}
/** Another consumer holds a live lease on the key: redeliver later. */
export class InProgressError extends ClaimRefusedError {
}
/** The key failed terminally: `claim.payload` is the stored error. Dead-letter the message. */
export class FailedError extends ClaimRefusedError {
}
/** The key exists with a different fingerprint (same key, different request). */
export class MismatchError extends ClaimRefusedError {
}
/** 55006: the lease was taken over or released; the fencing token is no longer the key's. `cause` is
 *  pg's 55006 error. `heartbeatError`, from withLease, is the last heartbeat that failed for another
 *  reason (a connection error, a timeout) with no successful heartbeat after it: often why the lease
 *  ran out; undefined when none failed. */
export class LeaseLostError extends IdempotencyError {
    op;
    lease;
    heartbeatError;
    constructor(op, lease, cause, heartbeatError) {
        super(`lease lost: ${op}(${JSON.stringify(lease.key)}, scope ${JSON.stringify(lease.scope)}, token ` +
            `${lease.token}): ${cause?.message ?? cause}` +
            (heartbeatError === undefined ? "" :
                ` (after a failed heartbeat: ${heartbeatError?.message ?? heartbeatError})`), { cause });
        this.op = op;
        this.lease = lease;
        this.heartbeatError = heartbeatError;
    }
}
/** err with hb as the heartbeatError of its lease loss (a new LeaseLostError), any other error as is. */
export function withHeartbeatError(err, hb) {
    if (hb === undefined || !(err instanceof LeaseLostError) || err.heartbeatError !== undefined)
        return err;
    return new LeaseLostError(err.op, err.lease, err.cause, hb);
}
/** The handler failed; its error is `cause`. `outcome` is idem_fail's answer ("released": another
 *  attempt may claim the key; "failed": terminal), or null when recording the failure itself failed
 *  (`recordError`, e.g. a LeaseLostError). */
export class HandlerError extends IdempotencyError {
    key;
    outcome;
    recordError;
    constructor(key, cause, outcome, recordError = null) {
        super(`handler of key ${JSON.stringify(key)} failed${outcome ? ` (${outcome})` : ""}: ` +
            `${cause?.message ?? cause}` +
            (recordError ? ` (recording the failure failed: ${recordError?.message ?? recordError})` : ""), { cause });
        this.key = key;
        this.outcome = outcome;
        this.recordError = recordError;
    }
    /** true when no later delivery will run the handler (the key is failed) */
    get terminal() { return this.outcome === "failed"; }
}
/** Marks a handler's error as terminal: the key is recorded as failed (idem_fail retryable => false). */
export class PermanentError extends Error {
    constructor(message, options) {
        super(message, options);
        this.name = "PermanentError";
    }
}
export function permanent(err) {
    return err instanceof PermanentError ? err
        : new PermanentError(err?.message ?? String(err), { cause: err });
}
/** The SQLSTATE of a database error (pg's DatabaseError, or one inside `cause`), else undefined. */
export function sqlState(err) {
    for (let e = err, depth = 0; e && depth < 8; e = e.cause, depth++) {
        if (typeof e.code === "string" && /^[0-9A-Z]{5}$/.test(e.code) && "severity" in e)
            return e.code;
    }
    return undefined;
}
/** true for a serialization failure (40001) or a deadlock (40P01): run the whole transaction again. */
export function isRetryable(err) {
    const s = sqlState(err);
    return s === "40001" || s === "40P01";
}
/** true when the key is terminally failed: a FailedError from the claim, or a HandlerError that made it so. */
export function isTerminal(err) {
    return err instanceof FailedError || (err instanceof HandlerError && err.terminal);
}
