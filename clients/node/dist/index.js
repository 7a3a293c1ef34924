import { ClaimRefusedError, HandlerError, PermanentError, isRetryable, isTerminal, withHeartbeatError } from "./errors.js";
import { claim, complete, errorPayload, fail, keepAlive, leaseOf, refusal } from "./calls.js";
export * from "./types.js";
export { IdempotencyError, ClaimRefusedError, InProgressError, FailedError, MismatchError, LeaseLostError, HandlerError, PermanentError, permanent, sqlState, isRetryable, isTerminal, } from "./errors.js";
export { claim, refusal, leaseOf, complete, fail, heartbeat, errorPayload, keepAlive } from "./calls.js";
export { idempotency, idempotencyOf } from "./http.js";
export { KeyFieldError, MAX_KEY_LENGTH, parseKey, pathMatches, problem, replayedResponse, requestFingerprint, storedResponse } from "./httpwire.js";
export * from "./derive.js";
/** Runs fn in a transaction on a connection of the pool and commits; a serialization failure or a
 *  deadlock (in fn or at commit) rolls back and runs fn again, up to maxAttempts in all. Any other error
 *  rolls back and is thrown as is. fn must not commit or roll back. */
export async function withTransaction(pool, fn, opts = {}) {
    const maxAttempts = opts.maxAttempts ?? 5;
    const begin = opts.isolation ? `BEGIN ISOLATION LEVEL ${isolationSQL(opts.isolation)}` : "BEGIN";
    for (let attempt = 1;; attempt++) {
        const client = await pool.connect();
        let broken = undefined;
        try {
            await client.query(begin);
            let out;
            try {
                out = await fn(client);
                await client.query("COMMIT");
            }
            catch (err) {
                await client.query("ROLLBACK").catch((e) => { broken = e; });
                throw err;
            }
            return out;
        }
        catch (err) {
            if (!isRetryable(err) || attempt >= maxAttempts)
                throw err;
        }
        finally {
            client.release(broken instanceof Error ? broken : undefined);
        }
        await new Promise((r) => setTimeout(r, Math.random() * 10 * attempt));
    }
}
function isolationSQL(i) {
    switch (i) {
        case "read committed": return "READ COMMITTED";
        case "repeatable read": return "REPEATABLE READ";
        case "serializable": return "SERIALIZABLE";
        default: throw new TypeError(`unknown isolation level ${i}`);
    }
}
/** The guard inside the caller's open transaction (one-transaction mode):
 *  - idem_claim; a duplicate returns the stored result (replayed) without running the handler; a
 *    refused claim throws InProgressError, FailedError or MismatchError;
 *  - claimed: the handler runs in a savepoint; its result is stored with idem_complete;
 *  - the handler throws: rolled back to the savepoint, the failure recorded with idem_fail (terminal for
 *    a PermanentError), and a HandlerError thrown: COMMIT so that the failure is recorded;
 *  - a serialization failure or deadlock from the handler is thrown as is: roll back and run the whole
 *    transaction again.
 *  The caller commits: the handler's writes and the stored result commit together, or not at all. */
export async function guardInTransaction(client, key, handler, opts = {}) {
    const c = await claim(client, key, opts);
    if (c.outcome === "completed")
        return { result: c.payload, replayed: true, attempts: c.attempts };
    const refused = refusal(c);
    if (refused)
        throw refused;
    const lease = { key, scope: c.scope, token: null };
    await client.query("SAVEPOINT idem_work");
    let result;
    try {
        result = await handler(client);
    }
    catch (err) {
        if (isRetryable(err))
            throw err;
        await client.query("ROLLBACK TO SAVEPOINT idem_work");
        let outcome;
        try {
            outcome = await fail(client, lease, errorPayload(err), !(err instanceof PermanentError));
        }
        catch (ferr) {
            if (isRetryable(ferr))
                throw ferr;
            throw new HandlerError(key, err, null, ferr);
        }
        throw new HandlerError(key, err, outcome);
    }
    await client.query("RELEASE SAVEPOINT idem_work");
    await complete(client, lease, result);
    return { result, replayed: false, attempts: c.attempts };
}
/** guardInTransaction in a transaction of its own on a pool connection, committed; retried on
 *  40001 / 40P01. Throws HandlerError (after committing the recorded failure), InProgressError,
 *  FailedError, MismatchError, or the database's error. */
export async function guard(pool, key, handler, opts = {}) {
    let outcome = null;
    const res = await withTransaction(pool, async (client) => {
        outcome = null;
        try {
            return await guardInTransaction(client, key, handler, opts);
        }
        catch (err) {
            if ((err instanceof HandlerError && err.recordError === null) || err instanceof ClaimRefusedError) {
                outcome = err; // commit: the recorded failure must persist
                return null;
            }
            throw err;
        }
    }, opts);
    if (outcome)
        throw outcome;
    return res;
}
/** A kafkajs eachMessage handler (or any consumer callback) guarded in one-transaction mode: returns
 *  when the message was processed now or before (a replay), or dead-lettered; throws otherwise, so that
 *  the consumer redelivers (InProgressError, a released HandlerError, a database error). */
export function eachMessage(pool, opts) {
    return async (payload) => {
        try {
            await guard(pool, opts.key(payload), (client) => opts.handler(payload, client), opts);
        }
        catch (err) {
            if (opts.onDeadLetter && isTerminal(err)) {
                await opts.onDeadLetter(payload, err);
                return;
            }
            throw err;
        }
    };
}
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
export async function withLease(db, key, handler, opts = {}) {
    const ttlMs = opts.ttlMs ?? 30_000;
    const c = await claim(db, key, { ...opts, ttlMs });
    if (c.outcome === "completed")
        return { result: c.payload, replayed: true, attempts: c.attempts };
    const refused = refusal(c);
    if (refused)
        throw refused;
    const lease = leaseOf(c);
    const ka = keepAlive(db, lease, ttlMs, opts.heartbeatMs ?? ttlMs / 3, opts.onHeartbeatError);
    let result;
    let herr = undefined;
    let threw = false;
    try {
        result = await handler(lease, ka.signal);
    }
    catch (err) {
        threw = true;
        herr = err;
    }
    const { lost, heartbeatError } = await ka.stop();
    if (lost)
        throw lost;
    if (!threw) {
        try {
            await complete(db, lease, result);
        }
        catch (err) {
            throw withHeartbeatError(err, heartbeatError);
        }
        return { result: result, replayed: false, attempts: c.attempts };
    }
    let outcome;
    try {
        outcome = await fail(db, lease, errorPayload(herr), !(herr instanceof PermanentError));
    }
    catch (ferr) {
        throw new HandlerError(key, herr, null, withHeartbeatError(ferr, heartbeatError));
    }
    throw new HandlerError(key, herr, outcome);
}
