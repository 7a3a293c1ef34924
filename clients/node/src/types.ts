// The types the client's calls take and answer (re-exported by index.ts).
import type { PoolClient, QueryResult } from "pg";

export const VERSION = "0.1.0";
export const DEFAULT_SCOPE = "default";

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
