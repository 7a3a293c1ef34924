import type { Claim, ClaimOptions, Lease, Queryable } from "./types.js";
import { ClaimRefusedError, LeaseLostError } from "./errors.js";
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
/** The heartbeats of a lease, from keepAlive. */
export interface KeepAlive {
    /** aborted when a heartbeat finds the lease lost (its reason: the LeaseLostError) */
    signal: AbortSignal;
    /** stops the heartbeats, waiting for one in flight; gives the loss a heartbeat found (null when none)
     *  and the last heartbeat that failed otherwise with no successful one after it (undefined when none) */
    stop(): Promise<{
        lost: LeaseLostError | null;
        heartbeatError: unknown;
    }>;
}
/** idem_heartbeat of `lease` every `everyMs` (none for 0) until stop(). A heartbeat that finds the lease
 *  lost aborts `signal` and ends them; one that fails otherwise goes to onHeartbeatError and the next beat
 *  tries again. */
export declare function keepAlive(db: Queryable, lease: Lease, ttlMs: number, everyMs: number, onHeartbeatError?: (err: unknown) => void): KeepAlive;
