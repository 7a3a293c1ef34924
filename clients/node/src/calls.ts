// The SQL calls of the client (idem_claim, idem_complete, idem_fail, idem_heartbeat), typed, and the
// heartbeats of a lease (keepAlive), which withLease and the HTTP middleware share. Re-exported by index.ts.
import type { Claim, ClaimOptions, Lease, Queryable } from "./types.js";
import { DEFAULT_SCOPE } from "./types.js";
import { ClaimRefusedError, FailedError, InProgressError, LeaseLostError, MismatchError, sqlState,
         withHeartbeatError } from "./errors.js";

// ------------------------------------------------------------------------------------------------
// The SQL calls

const scopeOf = (s?: string) => s || DEFAULT_SCOPE;
const ttlArg = (ms?: number) => (ms === undefined || ms === null ? null : ms);
const jsonArg = (v: unknown) => (v === undefined || v === null ? null : JSON.stringify(v));

function leaseError(op: string, lease: Lease, err: unknown): unknown {
  return sqlState(err) === "55006" ? new LeaseLostError(op, lease, err) : err;
}

/** idem_claim. The outcome is returned as is (see refusal() for the error of a refused claim). */
export async function claim(db: Queryable, key: string, opts: ClaimOptions = {}): Promise<Claim> {
  const scope = scopeOf(opts.scope);
  const { rows: [r] } = await db.query(
    `SELECT outcome, token::text AS token, attempts, payload, expires_at
       FROM idem_claim($1, ttl => $2::float8 * interval '1 millisecond', scope => $3, fingerprint => $4,
                       wait => $5)`,
    [key, ttlArg(opts.ttlMs), scope, opts.fingerprint ?? null, opts.wait ?? true]);
  return { key, scope, outcome: r.outcome, token: r.token, attempts: r.attempts ?? 0,
           payload: r.payload, expiresAt: r.expires_at };
}

/** The error of a refused claim (in_progress, failed, mismatch), null for claimed and completed. */
export function refusal(c: Claim): ClaimRefusedError | null {
  switch (c.outcome) {
    case "claimed": case "completed": return null;
    case "in_progress": return new InProgressError(c);
    case "failed": return new FailedError(c);
    case "mismatch": return new MismatchError(c);
    default: return new ClaimRefusedError(c);
  }
}

export function leaseOf(c: Claim): Lease {
  return { key: c.key, scope: c.scope, token: c.token };
}

/** idem_complete with the lease's token (none for a claim of this transaction). */
export async function complete(db: Queryable, lease: Lease, result?: unknown): Promise<void> {
  try {
    await db.query("SELECT idem_complete($1, $2::jsonb, $3, $4::bigint)",
                   [lease.key, jsonArg(result), scopeOf(lease.scope), lease.token]);
  } catch (err) {
    throw leaseError("idem_complete", lease, err);
  }
}

/** idem_fail: "released" (another attempt may claim the key) or "failed" (terminal). */
export async function fail(db: Queryable, lease: Lease, error: unknown, retryable = true): Promise<"released" | "failed"> {
  try {
    const { rows: [r] } = await db.query("SELECT idem_fail($1, $2::jsonb, $3, $4, $5::bigint) AS outcome",
                                         [lease.key, jsonArg(error), retryable, scopeOf(lease.scope), lease.token]);
    return r.outcome;
  } catch (err) {
    throw leaseError("idem_fail", lease, err);
  }
}

/** idem_heartbeat: extends the lease, returns its new end. */
export async function heartbeat(db: Queryable, lease: Lease, ttlMs?: number): Promise<Date> {
  try {
    const { rows: [r] } = await db.query(
      "SELECT idem_heartbeat($1, $2::float8 * interval '1 millisecond', $3, $4::bigint) AS until",
      [lease.key, ttlArg(ttlMs), scopeOf(lease.scope), lease.token]);
    return r.until;
  } catch (err) {
    throw leaseError("idem_heartbeat", lease, err);
  }
}

/** How a failure is stored: {"error": message}. */
export function errorPayload(err: unknown): { error: string } {
  return { error: (err as Error)?.message ?? String(err) };
}

// ------------------------------------------------------------------------------------------------
// Heartbeats

/** The heartbeats of a lease, from keepAlive. */
export interface KeepAlive {
  /** aborted when a heartbeat finds the lease lost (its reason: the LeaseLostError) */
  signal: AbortSignal;
  /** stops the heartbeats, waiting for one in flight; gives the loss a heartbeat found (null when none)
   *  and the last heartbeat that failed otherwise with no successful one after it (undefined when none) */
  stop(): Promise<{ lost: LeaseLostError | null; heartbeatError: unknown }>;
}

/** idem_heartbeat of `lease` every `everyMs` (none for 0) until stop(). A heartbeat that finds the lease
 *  lost aborts `signal` and ends them; one that fails otherwise goes to onHeartbeatError and the next beat
 *  tries again. */
export function keepAlive(db: Queryable, lease: Lease, ttlMs: number, everyMs: number,
                          onHeartbeatError?: (err: unknown) => void): KeepAlive {
  const abort = new AbortController();
  let lost: LeaseLostError | null = null;
  let heartbeatError: unknown = undefined; // the last failed heartbeat, undefined after a successful one
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let inFlight: Promise<void> = Promise.resolve();
  const beat = () => {
    timer = null;
    if (stopped) return;
    inFlight = heartbeat(db, lease, ttlMs).then(() => { heartbeatError = undefined; }, (err) => {
      if (err instanceof LeaseLostError) {
        lost = withHeartbeatError(err, heartbeatError) as LeaseLostError;
        abort.abort(lost);
        return;
      }
      heartbeatError = err;
      onHeartbeatError?.(err);
    }).finally(() => {
      if (!stopped && !lost) timer = setTimeout(beat, everyMs);
    });
  };
  if (everyMs > 0) timer = setTimeout(beat, everyMs);
  return {
    signal: abort.signal,
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await inFlight;
      return { lost, heartbeatError };
    },
  };
}
