// Idempotency-Key for HTTP APIs: Express / Connect middleware whose stored response commits in the same
// transaction as the handler's writes (docs/http.md). Re-exported by index.ts.
//
//   app.use(idempotency({ pool, routes: [{ method: "POST", path: "/orders", require: true }] }));
//   app.post("/orders", express.json(), async (req, res) => {
//     const { client } = idempotencyOf(req)!;                 // the request's transaction
//     const { rows: [o] } = await client.query("INSERT INTO orders ... RETURNING id", [...]);
//     res.status(201).location(`/orders/${o.id}`).json(o);
//   });
//
// One-transaction mode (the default): BEGIN, idem_claim, the handler on that connection, idem_complete with
// the response, COMMIT; a response of 5xx (an error the framework answered) rolls it all back. Two-transaction
// mode: the claim commits a lease and a fencing token, heartbeats extend it while the handler runs in a second
// transaction, which completes with the token; a lease taken over meanwhile rolls it back.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Pool, PoolClient } from "pg";
import { claim, complete, fail, keepAlive, leaseOf } from "./calls.js";
import { LeaseLostError } from "./errors.js";
import type { Isolation } from "./index.js";
import type { Claim, Lease } from "./types.js";
import { KeyFieldError, MAX_KEY_LENGTH, parseKey, pathMatches, problem, replayedResponse, requestFingerprint,
         storedResponse, type StoredResponse } from "./httpwire.js";
import { captureResponse, readBody, send } from "./httpio.js";

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

export function idempotencyOf(req: IncomingMessage): HttpIdempotency | undefined {
  return (req as { idempotency?: HttpIdempotency }).idempotency;
}

type Next = (err?: unknown) => void;

const DEFAULT_ROUTES: Route[] = [{ method: "POST", path: "/**" }, { method: "PATCH", path: "/**" }];

/** The middleware: (req, res, next), for Express, Connect or any framework of that shape. */
export function idempotency(opts: HttpOptions): (req: IncomingMessage, res: ServerResponse, next: Next) => void {
  return (req, res, next) => { handle(opts, req, res, next).catch(next); };
}

function answer(res: ServerResponse, opts: HttpOptions, code: string, detail?: string, retryAfter?: number) {
  const p = problem(code, opts.problemBase, detail);
  const headers: [string, string][] = [["content-type", "application/problem+json"]];
  if (retryAfter !== undefined) headers.push(["retry-after", String(retryAfter)]);
  send(res, p.status, headers, p.body);
}

function refused(res: ServerResponse, opts: HttpOptions, c: Claim) {
  if (c.outcome === "mismatch") return answer(res, opts, "idempotency-key-reused");
  if (c.outcome === "failed") return answer(res, opts, "idempotency-key-failed");
  const until = c.expiresAt ? Math.max(1, Math.ceil((c.expiresAt.getTime() - Date.now()) / 1000)) : null;
  answer(res, opts, "idempotency-key-in-use", undefined, until ?? opts.retryAfter ?? 1);
}

function replay(res: ServerResponse, payload: unknown) {
  const r = replayedResponse(payload as StoredResponse);
  send(res, r.status, r.headers, r.body);
}

async function handle(opts: HttpOptions, req: IncomingMessage, res: ServerResponse, next: Next) {
  const target = (req as { originalUrl?: string }).originalUrl ?? req.url ?? "/";
  let path = target.split("?")[0];
  try { path = decodeURIComponent(path); } catch { /* as received */ }
  const route = (opts.routes ?? DEFAULT_ROUTES).find(
    (r) => (r.method === "*" || r.method.toUpperCase() === req.method) && pathMatches(r.path, path));
  if (!route) return next();
  const fields = req.headersDistinct["idempotency-key"] ?? [];
  let key: string | null = null;
  try {
    if (fields.length > 1) throw new KeyFieldError("more than one Idempotency-Key field");
    if (fields.length === 1) key = parseKey(fields[0], opts.maxKeyLength ?? MAX_KEY_LENGTH);
  } catch (err) {
    if (err instanceof KeyFieldError) return answer(res, opts, "idempotency-key-invalid", err.message);
    throw err;
  }
  if (key === null && route.require) return answer(res, opts, "idempotency-key-missing");
  const limit = opts.maxBodyBytes ?? 1 << 20;
  const body = await readBody(req, limit);
  if (body === undefined) return; // the client went away
  if (body === null) return answer(res, opts, "request-too-large", `The request body is larger than ${limit} bytes.`);
  const info: HttpIdempotency = {
    key, scope: opts.scope?.(req) || opts.defaultScope || "http", mode: route.mode ?? opts.mode ?? "one-transaction",
    fingerprint: opts.fingerprint ? opts.fingerprint(req, body) ?? null : requestFingerprint(req.method!, target, body),
    token: null, client: undefined as unknown as PoolClient,
  };
  if (key !== null && info.mode === "two-transactions") return twoTransactions(opts, info, req, res, next);
  const client = await opts.pool.connect();
  let broken: Error | undefined;
  const rollback = () => client.query("ROLLBACK").catch((e) => { broken = e; });
  try {
    await client.query(opts.isolation ? `BEGIN ISOLATION LEVEL ${opts.isolation.toUpperCase()}` : "BEGIN");
    let lease: Lease | null = null;
    if (key !== null) {
      const c = await claim(client, key, { scope: info.scope, fingerprint: info.fingerprint ?? undefined,
                                           wait: opts.wait ?? false });
      if (c.outcome !== "claimed") {
        await rollback(); // nothing was written
        return c.outcome === "completed" ? replay(res, c.payload) : refused(res, opts, c);
      }
      lease = { key, scope: info.scope, token: null };
    }
    info.client = client;
    (req as { idempotency?: HttpIdempotency }).idempotency = info;
    const cap = captureResponse(res);
    next();
    const how = await cap.done;
    if (how === "closed" || res.statusCode >= 500) {
      await rollback(); // the key and the handler's writes vanish: a retry runs the handler again
      if (how === "ended") cap.flush();
      return;
    }
    try {
      if (lease) await complete(client, lease, stored(opts, res, cap.body()));
      await client.query("COMMIT");
    } catch (err) {
      await rollback();
      opts.onError?.(err, req);
      return cap.fail();
    }
    cap.flush();
  } catch (err) {
    await rollback();
    throw err;
  } finally {
    client.release(broken);
  }
}

function stored(opts: HttpOptions, res: ServerResponse, body: Buffer): StoredResponse {
  const header = (name: string): string[] => {
    const v = res.getHeader(name);
    return v === undefined ? [] : Array.isArray(v) ? v : [String(v)];
  };
  return storedResponse(res.statusCode, header, body, opts.keepHeaders ?? ["Content-Type", "Location"]);
}

async function twoTransactions(opts: HttpOptions, info: HttpIdempotency, req: IncomingMessage, res: ServerResponse,
                               next: Next) {
  const leaseMs = opts.leaseMs ?? 30_000;
  const c = await claim(opts.pool, info.key!, { scope: info.scope, fingerprint: info.fingerprint ?? undefined,
                                                wait: opts.wait ?? false, ttlMs: leaseMs }); // commits by itself
  if (c.outcome === "completed") return replay(res, c.payload);
  if (c.outcome !== "claimed") return refused(res, opts, c);
  const lease = leaseOf(c);
  const release = (doc: unknown) => fail(opts.pool, lease, doc, true).catch((e) => opts.onError?.(e, req));
  const beats = keepAlive(opts.pool, lease, leaseMs, opts.heartbeatMs ?? leaseMs / 3,
                          opts.onError && ((e) => opts.onError!(e, req)));
  let client: PoolClient;
  try {
    client = await opts.pool.connect();
  } catch (err) {
    await beats.stop();
    await release({ error: "connect", message: String(err) });
    throw err;
  }
  let broken: Error | undefined;
  const rollback = () => client.query("ROLLBACK").catch((e) => { broken = e; });
  try {
    await client.query(opts.isolation ? `BEGIN ISOLATION LEVEL ${opts.isolation.toUpperCase()}` : "BEGIN");
    Object.assign(info, { client, token: lease.token, signal: beats.signal });
    (req as { idempotency?: HttpIdempotency }).idempotency = info;
    const cap = captureResponse(res);
    next();
    const how = await cap.done;
    const { lost } = await beats.stop();
    if (lost) {
      await rollback();
      return how === "ended" ? (cap.discard(), answer(res, opts, "idempotency-lease-lost", undefined, 1)) : undefined;
    }
    if (how === "closed" || res.statusCode >= 500) {
      await rollback();
      await release(how === "closed" ? { error: "closed" } : { error: "status", status: res.statusCode });
      if (how === "ended") cap.flush();
      return;
    }
    try {
      await complete(client, lease, stored(opts, res, cap.body())); // with the token, in this transaction
      await client.query("COMMIT");
    } catch (err) {
      await rollback();
      if (err instanceof LeaseLostError) return (cap.discard(), answer(res, opts, "idempotency-lease-lost", undefined, 1));
      await release({ error: "complete", message: (err as Error).message });
      opts.onError?.(err, req);
      return cap.fail();
    }
    cap.flush();
  } catch (err) {
    await beats.stop();
    await rollback();
    await release({ error: (err as Error)?.name ?? "error", message: (err as Error)?.message ?? String(err) });
    throw err;
  } finally {
    client.release(broken);
  }
}
