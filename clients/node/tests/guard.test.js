// One-transaction mode: guard(), guardInTransaction(), eachMessage(), withTransaction().
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import {
  guard, guardInTransaction, eachMessage, withTransaction, complete, claim, permanent, isRetryable, sqlState,
  HandlerError, FailedError, MismatchError, LeaseLostError, ClaimRefusedError, fingerprint,
} from "../dist/index.js";
import { newPool, newKey, sleep, setupLedger, ledgerRows, status } from "./helpers.js";

let pool;
before(async () => { pool = newPool(); await setupLedger(pool); });
after(async () => { await pool.end(); });

test("two concurrent clients race one key: the handler runs once, the other replays", async () => {
  const key = newKey("race");
  // two consumers, each with its own pool (its own connections), three deliveries each
  const consumers = [newPool(3), newPool(3)];
  let runs = 0;
  try {
    const results = await Promise.all(consumers.flatMap((p, c) => [0, 1, 2].map(() =>
      guard(p, key, async (client) => {
        runs++;
        await sleep(100); // the others wait on the key meanwhile
        await client.query("INSERT INTO ledger (key, note) VALUES ($1, $2)", [key, `consumer ${c}`]);
        return { charged: true, by: c };
      }, { scope: "node-race" }))));
    assert.equal(runs, 1);
    assert.equal(results.filter((r) => !r.replayed).length, 1);
    for (const r of results) assert.equal(r.result.charged, true);
    assert.equal(new Set(results.map((r) => r.result.by)).size, 1);
    assert.equal(await ledgerRows(pool, key), 1);
    assert.equal((await status(pool, key, "node-race")).status, "completed");
  } finally {
    await Promise.all(consumers.map((p) => p.end()));
  }
});

test("replay: a duplicate gets the stored result without running the handler", async () => {
  const key = newKey("replay");
  const first = await guard(pool, key, async (client) => {
    await client.query("INSERT INTO ledger (key) VALUES ($1)", [key]);
    return { receipt: 7 };
  });
  assert.deepEqual(first, { result: { receipt: 7 }, replayed: false, attempts: 1 });
  const second = await guard(pool, key, async () => { throw new Error("ran for a duplicate"); });
  assert.deepEqual(second, { result: { receipt: 7 }, replayed: true, attempts: 1 });
  assert.equal(await ledgerRows(pool, key), 1);
});

test("terminal failure: the work is rolled back to the savepoint, the failure is committed", async () => {
  const key = newKey("terminal");
  await assert.rejects(guard(pool, key, async (client) => {
    await client.query("INSERT INTO ledger (key, note) VALUES ($1, 'must vanish')", [key]);
    throw permanent(new Error("card declined"));
  }, { scope: "node-fail" }), (err) => {
    assert.ok(err instanceof HandlerError);
    assert.equal(err.outcome, "failed");
    assert.equal(err.terminal, true);
    assert.equal(err.cause.message, "card declined");
    assert.equal(isRetryable(err), false);
    return true;
  });
  assert.equal(await ledgerRows(pool, key), 0);
  assert.equal((await status(pool, key, "node-fail")).status, "failed");
  await assert.rejects(guard(pool, key, async () => { throw new Error("ran for a terminal key"); }, { scope: "node-fail" }),
    (err) => err instanceof FailedError && err.claim.payload.error === "card declined");
});

test("retryable failure: released, a SQL error inside is rolled back, the next delivery runs again", async () => {
  const key = newKey("released");
  await assert.rejects(guard(pool, key, async (client) => { await client.query("SELECT 1/0"); }), (err) => {
    assert.ok(err instanceof HandlerError);
    assert.equal(err.outcome, "released");
    assert.equal(sqlState(err), "22012"); // the database's error is the cause, intact
    assert.ok(err.cause instanceof pg.DatabaseError);
    return true;
  });
  const r = await guard(pool, key, async () => "ok");
  assert.deepEqual(r, { result: "ok", replayed: false, attempts: 2 });
});

test("guardInTransaction: the caller's transaction, with its own writes beside", async () => {
  const key = newKey("intx");
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const r = await guardInTransaction(client, key, async (c) => {
      await c.query("INSERT INTO ledger (key, note) VALUES ($1, 'inside')", [key]);
      return 1;
    });
    assert.equal(r.replayed, false);
    await client.query("ROLLBACK"); // the caller decides: nothing stays, the key is free again
  } finally {
    client.release();
  }
  assert.equal(await ledgerRows(pool, key), 0);
  const r = await guard(pool, key, async () => 2);
  assert.deepEqual(r, { result: 2, replayed: false, attempts: 1 });
});

test("a serialization failure (40001) is retried by withTransaction and is no lease loss", async () => {
  const key = newKey("serial");
  let attempts = 0;
  let firstErr = null;
  const r = await withTransaction(pool, async (client) => {
    attempts++;
    await client.query("SELECT 1"); // the snapshot
    if (attempts === 1) await guard(pool, key, async () => "by the other");
    try {
      return await guardInTransaction(client, key, async () => "by me");
    } catch (err) {
      if (attempts === 1) firstErr = err;
      throw err;
    }
  }, { isolation: "repeatable read", maxAttempts: 3 });
  assert.equal(attempts, 2);
  assert.equal(sqlState(firstErr), "40001");
  assert.ok(isRetryable(firstErr));
  assert.ok(!(firstErr instanceof LeaseLostError));
  assert.deepEqual(r, { result: "by the other", replayed: true, attempts: 1 });
});

test("database errors are thrown as pg raised them", async () => {
  await assert.rejects(complete(pool, { key: newKey("missing"), scope: "default", token: "1" }, null),
    (err) => err instanceof pg.DatabaseError && err.code === "P0002");
  await assert.rejects(claim(pool, ""), (err) => err instanceof pg.DatabaseError && err.code === "22023");
});

test("fingerprint mismatch is a MismatchError", async () => {
  const key = newKey("mismatch");
  await guard(pool, key, async () => null, { fingerprint: fingerprint({ amount: 10 }) });
  await assert.rejects(guard(pool, key, async () => null, { fingerprint: fingerprint({ amount: 11 }) }),
    (err) => err instanceof MismatchError && err instanceof ClaimRefusedError);
  const r = await guard(pool, key, async () => { throw new Error("ran"); }, { fingerprint: fingerprint({ amount: 10.0 }) });
  assert.equal(r.replayed, true);
});

test("eachMessage: a kafkajs-shaped handler with duplicates and a dead letter", async () => {
  const base = newKey("each");
  const deadLetters = [];
  const handle = eachMessage(pool, {
    scope: "node-each",
    key: ({ message }) => `${base}-${message.headers["idempotency-key"].toString()}`,
    handler: async ({ message }, client) => {
      const body = JSON.parse(message.value.toString());
      if (body.poison) throw permanent(new Error("unparseable order"));
      await client.query("INSERT INTO ledger (key, note) VALUES ($1, $2)", [`${base}-${body.id}`, "order"]);
      return { id: body.id };
    },
    onDeadLetter: async ({ message }, err) => { deadLetters.push([message.headers["idempotency-key"].toString(), err.constructor.name]); },
  });
  const msg = (id, extra = {}) => ({ topic: "orders", partition: 0, message: {
    headers: { "idempotency-key": Buffer.from(String(id)) }, value: Buffer.from(JSON.stringify({ id, ...extra })) } });
  for (const m of [msg(1), msg(2), msg(1), msg(3, { poison: true }), msg(2), msg(3, { poison: true })]) await handle(m);
  assert.equal(await ledgerRows(pool, `${base}-1`), 1);
  assert.equal(await ledgerRows(pool, `${base}-2`), 1);
  assert.equal(await ledgerRows(pool, `${base}-3`), 0);
  assert.deepEqual(deadLetters, [["3", "HandlerError"], ["3", "FailedError"]]);
});
