// The Express middleware (idempotency()) in a real server process (http_app.js), driven by fetch over TCP,
// against the test cluster: concurrency, replays, 400 / 409 / 413 / 422, rollback of failed handlers,
// scopes. The kill -9 runs are in http_kill.test.js.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { newPool } from "./helpers.js";
import { Server, TABLES, assertProblem, assertReplay, counts, newKey, poll, post, record, sf } from "./http_server.js";

let pool, server;
before(async () => {
  pool = newPool();
  await pool.query(TABLES);
  server = new Server(pool, 0);
  await server.start();
});
after(async () => {
  await server.stop();
  await pool.end();
});

const book = { item: "book" };

test("50 concurrent requests with one key: one runs, 49 are 409, retries replay it", async () => {
  const key = newKey("fifty");
  const early = [];
  let all49;
  const arrived49 = new Promise((resolve) => { all49 = resolve; });
  const sent = Array.from({ length: 50 }, () => post(server.url, "/orders", key, book, { "x-test-gate": key })
    .then((r) => { early.push(r); if (early.length === 49) all49(); return r; }));
  await arrived49; // the holder waits at its gate: the 49 others answer first
  for (const r of early.slice(0, 49)) {
    assertProblem(r, 409, "idempotency-key-in-use");
    assert.ok(Number(r.headers.get("retry-after")) >= 1);
  }
  await post(server.url, `/_test/gates/${key}`, null, {});
  const first = (await Promise.all(sent)).filter((r) => r.status !== 409);
  assert.equal(first.length, 1);
  assert.equal(first[0].status, 201);
  assert.equal(first[0].headers.get("idempotent-replayed"), null);
  const retries = await Promise.all(Array.from({ length: 5 }, () => post(server.url, "/orders", key, book)));
  for (const r of retries) assertReplay(r, first[0]);
  assert.deepEqual(await counts(pool, key), [1, 1]);
});

test("sequential retries replay the status, the kept headers and the body", async () => {
  const key = newKey("seq");
  const first = await post(server.url, "/orders", key, book);
  assert.equal(first.status, 201);
  assert.equal(first.headers.get("x-custom"), "first-run-only");
  for (let i = 0; i < 3; i++) {
    const r = await post(server.url, "/orders", key, book);
    assertReplay(r, first);
    assert.equal(r.headers.get("location"), first.headers.get("location"));
    assert.equal(r.headers.get("content-type"), first.headers.get("content-type"));
    assert.equal(r.headers.get("x-custom"), null);
  }
  assert.deepEqual(await counts(pool, key), [1, 1]);
});

test("a reused key with another request is 422", async () => {
  const key = newKey("reuse");
  assert.equal((await post(server.url, "/orders", key, book)).status, 201);
  assertProblem(await post(server.url, "/orders", key, { item: "lamp" }), 422, "idempotency-key-reused");
  assertProblem(await post(server.url, "/notes", key, book), 422, "idempotency-key-reused"); // another path
  assert.deepEqual(await counts(pool, key), [1, 1]);
});

test("a key missing, invalid or repeated is 400 and the handler does not run", async () => {
  const { rows: [{ n: before }] } = await pool.query("SELECT count(*)::int AS n FROM http_runs");
  assertProblem(await post(server.url, "/orders", null, book), 400, "idempotency-key-missing");
  for (const field of ["abc", '"a" "b"', '""', `"${"k".repeat(256)}"`]) {
    assertProblem(await post(server.url, "/orders", null, book, { "idempotency-key": field }), 400, "idempotency-key-invalid");
  }
  const two = new Headers([["content-type", "application/json"], ["idempotency-key", '"a"'], ["idempotency-key", '"b"']]);
  const r = await fetch(`${server.url}/orders`, { method: "POST", headers: two, body: "{}" });
  assertProblem({ status: r.status, headers: r.headers, body: await r.text() }, 400, "idempotency-key-invalid");
  const { rows: [{ n: after }] } = await pool.query("SELECT count(*)::int AS n FROM http_runs");
  assert.equal(after, before);
  const a = await post(server.url, "/notes", null, book), b = await post(server.url, "/notes", null, book);
  assert.equal(a.status, 201);
  assert.equal(b.status, 201);
  assert.notEqual(a.body, b.body); // key optional: runs each time
});

for (const how of ["raise", "500"]) {
  test(`a handler that fails (${how}) leaves no row and no key; a retry succeeds`, async () => {
    const key = newKey(`fail-${how}`);
    assert.equal((await post(server.url, "/orders", key, book, { "x-test-fail": how })).status, 500);
    assert.deepEqual(await counts(pool, key), [1, 0]);
    assert.equal(await record(pool, key), null);
    const r = await post(server.url, "/orders", key, book);
    assert.equal(r.status, 201);
    assert.equal(r.headers.get("idempotent-replayed"), null);
    assert.deepEqual(await counts(pool, key), [2, 1]);
  });
}

test("a body over the limit is 413 before the handler", async () => {
  const key = newKey("big");
  assertProblem(await post(server.url, "/orders", key, { item: "x".repeat(2000) }), 413, "request-too-large");
  const stream = new ReadableStream({ start(c) { for (let i = 0; i < 10; i++) c.enqueue(new Uint8Array(200).fill(32)); c.close(); } });
  const r = await fetch(`${server.url}/orders`, { method: "POST", body: stream, duplex: "half",
                                                  headers: { "idempotency-key": sf(key), "content-type": "application/json" } });
  assertProblem({ status: r.status, headers: r.headers, body: await r.text() }, 413, "request-too-large"); // no Content-Length
  assert.deepEqual(await counts(pool, key), [0, 0]);
});

test("scopes keep tenants apart", async () => {
  const key = newKey("tenant");
  const a = await post(server.url, "/orders", key, book, { "x-tenant": "acme" });
  const b = await post(server.url, "/orders", key, book, { "x-tenant": "globex" });
  assert.equal(a.status, 201);
  assert.equal(b.status, 201);
  assert.notEqual(a.body, b.body);
  assertReplay(await post(server.url, "/orders", key, book, { "x-tenant": "acme" }), a);
  assert.deepEqual([await counts(pool, key, "acme"), await counts(pool, key, "globex"), await counts(pool, key)],
                   [[1, 1], [1, 1], [0, 0]]);
});

test("two transactions: a failure releases the key; a 409 tells the lease's end", async () => {
  const key = newKey("two-fail");
  assert.equal((await post(server.url, "/payments", key, book, { "x-test-fail": "500" })).status, 500);
  const rec = await record(pool, key);
  assert.equal(rec.status, "pending");
  assert.equal(rec.token, null);
  assert.deepEqual(rec.error, { error: "status", status: 500 });
  const held = post(server.url, "/payments", key, book, { "x-test-gate": key });
  await poll("the second run to start", async () => (await counts(pool, key))[0] === 2);
  const busy = await post(server.url, "/payments", key, book);
  assertProblem(busy, 409, "idempotency-key-in-use");
  const after = Number(busy.headers.get("retry-after"));
  assert.ok(after >= 1 && after <= 3, `Retry-After ${after}: not from the 3 s lease`);
  await post(server.url, `/_test/gates/${key}`, null, {});
  assert.equal((await held).status, 201);
  assert.deepEqual(await counts(pool, key), [2, 1]);
});
