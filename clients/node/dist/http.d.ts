import type { IncomingMessage, ServerResponse } from "node:http";
import type { Pool, PoolClient } from "pg";
import type { Isolation } from "./index.js";
export type HttpMode = "one-transaction" | "two-transactions";
/** Requests the middleware handles: `method` ("*": any) and a `path` pattern (see pathMatches). `require`:
 *  a request without Idempotency-Key gets 400. `mode`: the middleware's when absent. */
export interface Route {
    method: string;
    path: string;
    require?: boolean;
    mode?: HttpMode;
}
export interface HttpOptions {
    /** a pg.Pool: a connection per request (two in two-transaction mode, the second for heartbeats) */
    pool: Pool;
    /** default: POST and PATCH on every path, key optional */
    routes?: Route[];
    mode?: HttpMode;
    /** the lease of two-transaction mode (default 30 s), extended every heartbeatMs (default leaseMs / 3) */
    leaseMs?: number;
    heartbeatMs?: number;
    /** the tenant or user whose keys these are; empty: defaultScope ("http" when absent) */
    scope?: (req: IncomingMessage) => string | null | undefined;
    defaultScope?: string;
    /** replaces the default (method, target, body); null or undefined turns the check off */
    fingerprint?: (req: IncomingMessage, body: Buffer) => string | null | undefined;
    /** headers a replay gives back (default Content-Type and Location) */
    keepHeaders?: string[];
    /** a larger body is refused with 413 before the handler runs (default 1 MiB) */
    maxBodyBytes?: number;
    maxKeyLength?: number;
    /** a concurrent request waits for the holder's transaction and replays it, instead of 409 at once */
    wait?: boolean;
    /** Retry-After (seconds) of a 409 whose lease end is unknown (one-transaction mode; default 1) */
    retryAfter?: number;
    /** a URI the problem type is made of; about:blank without */
    problemBase?: string;
    isolation?: Isolation;
    /** hears of database errors answered with a bare 500, and of failed heartbeats */
    onError?: (err: unknown, req: IncomingMessage) => void;
}
/** What the handler gets (idempotencyOf(req), or req.idempotency): `client`, the pool client whose
 *  transaction commits with the stored response (write there; never COMMIT or ROLLBACK); `key` (null: the
 *  request came without one, and only the transaction applies); in two-transaction mode `token`, the fencing
 *  token, and `signal`, aborted when a heartbeat finds the lease taken over. */
export interface HttpIdempotency {
    client: PoolClient;
    key: string | null;
    scope: string;
    mode: HttpMode;
    fingerprint: string | null;
    token: string | null;
    signal?: AbortSignal;
}
export declare function idempotencyOf(req: IncomingMessage): HttpIdempotency | undefined;
type Next = (err?: unknown) => void;
/** The middleware: (req, res, next), for Express, Connect or any framework of that shape. */
export declare function idempotency(opts: HttpOptions): (req: IncomingMessage, res: ServerResponse, next: Next) => void;
export {};
