// kill -9 of the Express server in the middle of a handler, then a restart, in both modes; each prints its
// counts: requests sent, handler runs, business rows, replays (and 409s). Then a server frozen (SIGSTOP) in
// a two-transaction handler past its lease while a second server takes the key over: thawed, it is fenced
// off and its writes roll back (before the freeze, its heartbeats keep the lease past its first end); and a
// handler without heartbeats whose lease was taken over, whose completion is refused.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { newPool } from "./helpers.js";
import { Server, TABLES, assertProblem, assertReplay, counts, newKey, poll, post, record } from "./http_server.js";

let pool, server, other;
before(async () => {
  pool = newPool();
  await pool.query(TABLES);
  server = new Server(pool, 0);
  other = new Server(pool, 1);
  await Promise.all([server.start(), other.start()]);
});
after(async () => {
  await Promise.all([server.stop(), other.stop()]);
  await pool.end();
});

const book = { item: "book" };
const lit = async (sql, args) => (await pool.query(sql, args)).rows[0].b;

/** Sends a request whose handler blocks, waits until the handler runs, kills the server, and checks that the
 *  request got no answer. */
async function killInHandler(path, key) {
  const pending = post(server.url, path, key, book, { "x-test-block": "1" });
  await poll("the handler to start", async () => (await counts(pool, key))[0] === 1);
  await server.kill();
  assert.ok((await pending).error, "the killed server answered");
}

test("kill -9 in one-transaction mode: after the restart a retry runs the handler once", async () => {
  const key = newKey("kill1");
  await killInHandler("/orders", key);
  assert.deepEqual(await counts(pool, key), [1, 0]);
  assert.equal(await record(pool, key), null); // the claim went with the transaction
  await server.start();
  const first = await post(server.url, "/orders", key, book);
  assert.equal(first.status, 201);
  assert.equal(first.headers.get("idempotent-replayed"), null);
  assertReplay(await post(server.url, "/orders", key, book), first);
  const [runs, rows] = await counts(pool, key);
  assert.deepEqual([runs, rows], [2, 1]);
  console.log(`  kill -9 (one transaction, node): requests 3, handler runs ${runs}, business rows ${rows}, replays 1`);
});

test("kill -9 in two-transaction mode: 409 until the lease ends, then a new token; the old one is refused", async () => {
  const key = newKey("kill2");
  await killInHandler("/payments", key);
  const lease = await record(pool, key);
  assert.equal(lease.status, "pending");
  const oldToken = lease.token, ends = lease.expires_at;
  const leaseOn = () => lit("SELECT clock_timestamp() < $1 AS b", [ends]);
  // The retry reaches the other instance at once, while the killed one restarts: 409 while the lease is on.
  let r = await post(other.url, "/payments", key, book);
  let requests = 2, conflicts = 0;
  if (await leaseOn()) { // still on after the answer: it was on throughout
    assertProblem(r, 409, "idempotency-key-in-use");
    const after = Number(r.headers.get("retry-after"));
    assert.ok(after >= 1 && after <= 3, `Retry-After ${after}`);
    conflicts++;
  }
  await server.start();
  while (r.status === 409) {
    assertProblem(r, 409, "idempotency-key-in-use");
    await poll("the lease to end", async () => !(await leaseOn()));
    r = await post(server.url, "/payments", key, book);
    requests++;
  }
  assert.equal(r.status, 201, r.body);
  assert.equal(r.headers.get("idempotent-replayed"), null);
  const { rows: [run] } = await pool.query(
    "SELECT token::text AS token, started_at >= $3 AS after FROM http_runs WHERE idem_key = $1 AND token <> $2", [key, oldToken, ends]);
  assert.ok(BigInt(run.token) > BigInt(oldToken) && run.after, "a new token, after the old lease ended");
  await assert.rejects(pool.query("SELECT idem_complete($1, '{}'::jsonb, scope => 'http', token => $2)", [key, oldToken]),
    (err) => err.code === "55006"); // the old token's completion is refused
  assertReplay(await post(server.url, "/payments", key, book), r);
  requests++;
  const [runs, rows] = await counts(pool, key);
  assert.deepEqual([runs, rows], [2, 1]);
  const rec = await record(pool, key);
  assert.deepEqual([rec.status, rec.token, rec.attempts], ["completed", run.token, 2]);
  console.log(`  kill -9 (two transactions, node): requests ${requests}, handler runs ${runs}, business rows ${rows}, ` +
              `replays 1, conflicts 409 ${conflicts}`);
});

test("a frozen server past its lease is fenced off", async () => {
  const key = newKey("zombie");
  const first = post(server.url, "/payments", key, book, { "x-test-gate": key });
  await poll("the handler to start", async () => (await counts(pool, key))[0] === 1);
  const claimedUntil = (await record(pool, key)).expires_at;
  await poll("the first lease to have run out", () => lit("SELECT clock_timestamp() > $1 AS b", [claimedUntil]));
  assertProblem(await post(other.url, "/payments", key, book), 409, "idempotency-key-in-use"); // heartbeats extend it
  server.signal("SIGSTOP"); // no heartbeats: the lease runs out
  let taken;
  try {
    await poll("the frozen server's lease to end",
               () => lit("SELECT expires_at < clock_timestamp() AS b FROM idem_status($1, 'http')", [key]));
    taken = await post(other.url, "/payments", key, book);
  } finally {
    server.signal("SIGCONT");
  }
  assert.equal(taken.status, 201, taken.body);
  await post(server.url, `/_test/gates/${key}`, null, {});
  const stale = await first;
  assertProblem(stale, 409, "idempotency-lease-lost");
  assert.equal(stale.headers.get("location"), null); // nothing of the handler's response
  assert.deepEqual(await counts(pool, key), [2, 1]); // the frozen run's row went with its refused completion
  assertReplay(await post(server.url, "/payments", key, book), taken);
});

test("a completion whose lease was taken over is refused (no heartbeats)", async () => {
  const key = newKey("stale");
  const first = post(server.url, "/payments-unbeaten", key, book, { "x-test-gate": key });
  await poll("the handler to start", async () => (await counts(pool, key))[0] === 1);
  await poll("its lease to end", () => lit("SELECT expires_at < clock_timestamp() AS b FROM idem_status($1, 'http')", [key]));
  const taken = await post(server.url, "/payments-unbeaten", key, book);
  assert.equal(taken.status, 201, taken.body);
  await post(server.url, `/_test/gates/${key}`, null, {});
  const stale = await first;
  assertProblem(stale, 409, "idempotency-lease-lost"); // idem_complete with the old token: 55006
  assert.equal(stale.headers.get("location"), null);
  assert.deepEqual(await counts(pool, key), [2, 1]);
});
