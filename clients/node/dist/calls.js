import { DEFAULT_SCOPE } from "./types.js";
import { ClaimRefusedError, FailedError, InProgressError, LeaseLostError, MismatchError, sqlState, withHeartbeatError } from "./errors.js";
// ------------------------------------------------------------------------------------------------
// The SQL calls
const scopeOf = (s) => s || DEFAULT_SCOPE;
const ttlArg = (ms) => (ms === undefined || ms === null ? null : ms);
const jsonArg = (v) => (v === undefined || v === null ? null : JSON.stringify(v));
function leaseError(op, lease, err) {
    return sqlState(err) === "55006" ? new LeaseLostError(op, lease, err) : err;
}
/** idem_claim. The outcome is returned as is (see refusal() for the error of a refused claim). */
export async function claim(db, key, opts = {}) {
    const scope = scopeOf(opts.scope);
    const { rows: [r] } = await db.query(`SELECT outcome, token::text AS token, attempts, payload, expires_at
       FROM idem_claim($1, ttl => $2::float8 * interval '1 millisecond', scope => $3, fingerprint => $4,
                       wait => $5)`, [key, ttlArg(opts.ttlMs), scope, opts.fingerprint ?? null, opts.wait ?? true]);
    return { key, scope, outcome: r.outcome, token: r.token, attempts: r.attempts ?? 0,
        payload: r.payload, expiresAt: r.expires_at };
}
/** The error of a refused claim (in_progress, failed, mismatch), null for claimed and completed. */
export function refusal(c) {
    switch (c.outcome) {
        case "claimed":
        case "completed": return null;
        case "in_progress": return new InProgressError(c);
        case "failed": return new FailedError(c);
        case "mismatch": return new MismatchError(c);
        default: return new ClaimRefusedError(c);
    }
}
export function leaseOf(c) {
    return { key: c.key, scope: c.scope, token: c.token };
}
/** idem_complete with the lease's token (none for a claim of this transaction). */
export async function complete(db, lease, result) {
    try {
        await db.query("SELECT idem_complete($1, $2::jsonb, $3, $4::bigint)", [lease.key, jsonArg(result), scopeOf(lease.scope), lease.token]);
    }
    catch (err) {
        throw leaseError("idem_complete", lease, err);
    }
}
/** idem_fail: "released" (another attempt may claim the key) or "failed" (terminal). */
export async function fail(db, lease, error, retryable = true) {
    try {
        const { rows: [r] } = await db.query("SELECT idem_fail($1, $2::jsonb, $3, $4, $5::bigint) AS outcome", [lease.key, jsonArg(error), retryable, scopeOf(lease.scope), lease.token]);
        return r.outcome;
    }
    catch (err) {
        throw leaseError("idem_fail", lease, err);
    }
}
/** idem_heartbeat: extends the lease, returns its new end. */
export async function heartbeat(db, lease, ttlMs) {
    try {
        const { rows: [r] } = await db.query("SELECT idem_heartbeat($1, $2::float8 * interval '1 millisecond', $3, $4::bigint) AS until", [lease.key, ttlArg(ttlMs), scopeOf(lease.scope), lease.token]);
        return r.until;
    }
    catch (err) {
        throw leaseError("idem_heartbeat", lease, err);
    }
}
/** How a failure is stored: {"error": message}. */
export function errorPayload(err) {
    return { error: err?.message ?? String(err) };
}
/** idem_heartbeat of `lease` every `everyMs` (none for 0) until stop(). A heartbeat that finds the lease
 *  lost aborts `signal` and ends them; one that fails otherwise goes to onHeartbeatError and the next beat
 *  tries again. */
export function keepAlive(db, lease, ttlMs, everyMs, onHeartbeatError) {
    const abort = new AbortController();
    let lost = null;
    let heartbeatError = undefined; // the last failed heartbeat, undefined after a successful one
    let stopped = false;
    let timer = null;
    let inFlight = Promise.resolve();
    const beat = () => {
        timer = null;
        if (stopped)
            return;
        inFlight = heartbeat(db, lease, ttlMs).then(() => { heartbeatError = undefined; }, (err) => {
            if (err instanceof LeaseLostError) {
                lost = withHeartbeatError(err, heartbeatError);
                abort.abort(lost);
                return;
            }
            heartbeatError = err;
            onHeartbeatError?.(err);
        }).finally(() => {
            if (!stopped && !lost)
                timer = setTimeout(beat, everyMs);
        });
    };
    if (everyMs > 0)
        timer = setTimeout(beat, everyMs);
    return {
        signal: abort.signal,
        async stop() {
            stopped = true;
            if (timer)
                clearTimeout(timer);
            await inFlight;
            return { lost, heartbeatError };
        },
    };
}
