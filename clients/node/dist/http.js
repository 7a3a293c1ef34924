import { claim, complete, fail, keepAlive, leaseOf } from "./calls.js";
import { LeaseLostError } from "./errors.js";
import { KeyFieldError, MAX_KEY_LENGTH, parseKey, pathMatches, problem, replayedResponse, requestFingerprint, storedResponse } from "./httpwire.js";
import { captureResponse, readBody, send } from "./httpio.js";
export function idempotencyOf(req) {
    return req.idempotency;
}
const DEFAULT_ROUTES = [{ method: "POST", path: "/**" }, { method: "PATCH", path: "/**" }];
/** The middleware: (req, res, next), for Express, Connect or any framework of that shape. */
export function idempotency(opts) {
    return (req, res, next) => { handle(opts, req, res, next).catch(next); };
}
function answer(res, opts, code, detail, retryAfter) {
    const p = problem(code, opts.problemBase, detail);
    const headers = [["content-type", "application/problem+json"]];
    if (retryAfter !== undefined)
        headers.push(["retry-after", String(retryAfter)]);
    send(res, p.status, headers, p.body);
}
function refused(res, opts, c) {
    if (c.outcome === "mismatch")
        return answer(res, opts, "idempotency-key-reused");
    if (c.outcome === "failed")
        return answer(res, opts, "idempotency-key-failed");
    const until = c.expiresAt ? Math.max(1, Math.ceil((c.expiresAt.getTime() - Date.now()) / 1000)) : null;
    answer(res, opts, "idempotency-key-in-use", undefined, until ?? opts.retryAfter ?? 1);
}
function replay(res, payload) {
    const r = replayedResponse(payload);
    send(res, r.status, r.headers, r.body);
}
async function handle(opts, req, res, next) {
    const target = req.originalUrl ?? req.url ?? "/";
    let path = target.split("?")[0];
    try {
        path = decodeURIComponent(path);
    }
    catch { /* as received */ }
    const route = (opts.routes ?? DEFAULT_ROUTES).find((r) => (r.method === "*" || r.method.toUpperCase() === req.method) && pathMatches(r.path, path));
    if (!route)
        return next();
    const fields = req.headersDistinct["idempotency-key"] ?? [];
    let key = null;
    try {
        if (fields.length > 1)
            throw new KeyFieldError("more than one Idempotency-Key field");
        if (fields.length === 1)
            key = parseKey(fields[0], opts.maxKeyLength ?? MAX_KEY_LENGTH);
    }
    catch (err) {
        if (err instanceof KeyFieldError)
            return answer(res, opts, "idempotency-key-invalid", err.message);
        throw err;
    }
    if (key === null && route.require)
        return answer(res, opts, "idempotency-key-missing");
    const limit = opts.maxBodyBytes ?? 1 << 20;
    const body = await readBody(req, limit);
    if (body === undefined)
        return; // the client went away
    if (body === null)
        return answer(res, opts, "request-too-large", `The request body is larger than ${limit} bytes.`);
    const info = {
        key, scope: opts.scope?.(req) || opts.defaultScope || "http", mode: route.mode ?? opts.mode ?? "one-transaction",
        fingerprint: opts.fingerprint ? opts.fingerprint(req, body) ?? null : requestFingerprint(req.method, target, body),
        token: null, client: undefined,
    };
    if (key !== null && info.mode === "two-transactions")
        return twoTransactions(opts, info, req, res, next);
    const client = await opts.pool.connect();
    let broken;
    const rollback = () => client.query("ROLLBACK").catch((e) => { broken = e; });
    try {
        await client.query(opts.isolation ? `BEGIN ISOLATION LEVEL ${opts.isolation.toUpperCase()}` : "BEGIN");
        let lease = null;
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
        req.idempotency = info;
        const cap = captureResponse(res);
        next();
        const how = await cap.done;
        if (how === "closed" || res.statusCode >= 500) {
            await rollback(); // the key and the handler's writes vanish: a retry runs the handler again
            if (how === "ended")
                cap.flush();
            return;
        }
        try {
            if (lease)
                await complete(client, lease, stored(opts, res, cap.body()));
            await client.query("COMMIT");
        }
        catch (err) {
            await rollback();
            opts.onError?.(err, req);
            return cap.fail();
        }
        cap.flush();
    }
    catch (err) {
        await rollback();
        throw err;
    }
    finally {
        client.release(broken);
    }
}
function stored(opts, res, body) {
    const header = (name) => {
        const v = res.getHeader(name);
        return v === undefined ? [] : Array.isArray(v) ? v : [String(v)];
    };
    return storedResponse(res.statusCode, header, body, opts.keepHeaders ?? ["Content-Type", "Location"]);
}
async function twoTransactions(opts, info, req, res, next) {
    const leaseMs = opts.leaseMs ?? 30_000;
    const c = await claim(opts.pool, info.key, { scope: info.scope, fingerprint: info.fingerprint ?? undefined,
        wait: opts.wait ?? false, ttlMs: leaseMs }); // commits by itself
    if (c.outcome === "completed")
        return replay(res, c.payload);
    if (c.outcome !== "claimed")
        return refused(res, opts, c);
    const lease = leaseOf(c);
    const release = (doc) => fail(opts.pool, lease, doc, true).catch((e) => opts.onError?.(e, req));
    const beats = keepAlive(opts.pool, lease, leaseMs, opts.heartbeatMs ?? leaseMs / 3, opts.onError && ((e) => opts.onError(e, req)));
    let client;
    try {
        client = await opts.pool.connect();
    }
    catch (err) {
        await beats.stop();
        await release({ error: "connect", message: String(err) });
        throw err;
    }
    let broken;
    const rollback = () => client.query("ROLLBACK").catch((e) => { broken = e; });
    try {
        await client.query(opts.isolation ? `BEGIN ISOLATION LEVEL ${opts.isolation.toUpperCase()}` : "BEGIN");
        Object.assign(info, { client, token: lease.token, signal: beats.signal });
        req.idempotency = info;
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
            if (how === "ended")
                cap.flush();
            return;
        }
        try {
            await complete(client, lease, stored(opts, res, cap.body())); // with the token, in this transaction
            await client.query("COMMIT");
        }
        catch (err) {
            await rollback();
            if (err instanceof LeaseLostError)
                return (cap.discard(), answer(res, opts, "idempotency-lease-lost", undefined, 1));
            await release({ error: "complete", message: err.message });
            opts.onError?.(err, req);
            return cap.fail();
        }
        cap.flush();
    }
    catch (err) {
        await beats.stop();
        await rollback();
        await release({ error: err?.name ?? "error", message: err?.message ?? String(err) });
        throw err;
    }
    finally {
        client.release(broken);
    }
}
