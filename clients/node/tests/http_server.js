// The server processes of the HTTP tests (http_app.js) and what they poll: started on IDEM_HTTP_PORT and
// IDEM_HTTP_PORT + 1 (clients/node/test takes them from tests/ports "clients-http"), killed with SIGKILL,
// frozen with SIGSTOP, restarted; readiness, the end of a killed server's database sessions and the end of
// a lease are polled, never waited for by the clock.
import { spawn } from "node:child_process";
import { openSync } from "node:fs";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

const APP = new URL("./http_app.js", import.meta.url).pathname;

export const TABLES = `
CREATE TABLE IF NOT EXISTS http_orders (id serial PRIMARY KEY, idem_key text, scope text, item text);
CREATE TABLE IF NOT EXISTS http_runs (id serial PRIMARY KEY, idem_key text, scope text, mode text, token bigint,
                                      server_pid int, backend_pid int, started_at timestamptz DEFAULT clock_timestamp())`;

export async function poll(what, fn, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const out = await fn();
    if (out) return out;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const sf = (key) => `"${key.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`;
export const newKey = (name) => `${name}-${randomUUID().slice(0, 12)}`;

export class Server {
  constructor(pool, index) {
    const base = Number(process.env.IDEM_HTTP_PORT);
    assert.ok(base > 0, "IDEM_HTTP_PORT is not set: run clients/node/test");
    this.pool = pool;
    this.port = base + index;
    this.url = `http://127.0.0.1:${this.port}`;
    this.log = `/tmp/idem-node-http-${this.port}.log`;
    this.starts = 0;
  }

  async start() {
    this.starts++;
    this.appName = `idem-http-${this.port}-${process.pid}-${this.starts}`;
    const log = openSync(this.log, "a");
    this.proc = spawn(process.execPath, [APP], {
      env: { ...process.env, IDEM_HTTP_LISTEN: String(this.port), IDEM_HTTP_APP_NAME: this.appName, IDEM_HTTP_LEASE_MS: "3000" },
      stdio: ["ignore", log, log],
    });
    let exited = null;
    this.proc.once("exit", (code, signal) => { exited = `${code ?? signal}`; });
    await poll("the HTTP server to answer", async () => {
      assert.equal(exited, null, `the server exited (${exited}); see ${this.log}`);
      try {
        return (await fetch(`${this.url}/_test/health`)).ok;
      } catch {
        return false;
      }
    });
  }

  /** kill -9, then wait until PostgreSQL has ended every session of the process. */
  async kill() {
    const exit = new Promise((r) => this.proc.once("exit", r));
    this.proc.kill("SIGKILL");
    await exit;
    this.proc = null;
    await poll("the killed server's sessions to end", async () => (await this.pool.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1", [this.appName])).rows[0].n === 0);
  }

  signal(sig) { process.kill(this.proc.pid, sig); }

  async stop() {
    if (!this.proc) return;
    const exit = new Promise((r) => this.proc.once("exit", r));
    this.proc.kill("SIGTERM");
    await exit;
    this.proc = null;
  }
}

/** [handler runs, business rows] of a key in a scope. */
export async function counts(pool, key, scope = "http") {
  const q = async (t) => (await pool.query(`SELECT count(*)::int AS n FROM ${t} WHERE idem_key = $1 AND scope = $2`,
                                           [key, scope])).rows[0].n;
  return [await q("http_runs"), await q("http_orders")];
}

export async function record(pool, key, scope = "http") {
  const { rows } = await pool.query(
    "SELECT status, attempts, token::text AS token, expires_at, error FROM idem_status($1, $2)", [key, scope]);
  return rows[0] ?? null;
}

/** POST a JSON body (default {"item": "book"}) with the key (none for null) and headers; {status, headers, body}
 *  (body: the bytes as text), or {error} when the connection failed. */
export async function post(url, path, key, body = { item: "book" }, headers = {}) {
  const h = { "content-type": "application/json", ...headers };
  if (key !== null) h["idempotency-key"] = sf(key);
  try {
    const r = await fetch(url + path, { method: "POST", headers: h, body: JSON.stringify(body) });
    return { status: r.status, headers: r.headers, body: await r.text() };
  } catch (error) {
    return { error };
  }
}

export function assertProblem(r, status, code) {
  assert.equal(r.status, status, `${r.status} ${r.body ?? r.error}`);
  assert.equal(r.headers.get("content-type"), "application/problem+json");
  const doc = JSON.parse(r.body);
  assert.equal(doc.status, status);
  assert.equal(doc.code, code);
  assert.equal(doc.type, "about:blank");
  assert.ok(doc.title && doc.detail);
  return doc;
}

export function assertReplay(r, first) {
  assert.equal(r.status, first.status, r.body);
  assert.equal(r.body, first.body);
  assert.equal(r.headers.get("idempotent-replayed"), "true");
}
