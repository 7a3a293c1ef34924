// Two-transaction mode: withLease() with heartbeats, fencing tokens and lost leases.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { withLease, claim, permanent, isRetryable, sqlState, InProgressError, FailedError, LeaseLostError,
         HandlerError } from "../dist/index.js";
import { newPool, newKey, sleep, status } from "./helpers.js";

let pool;
before(async () => { pool = newPool(); });
after(async () => { await pool.end(); });

test("two concurrent clients race one key: one runs, the other is told it is in progress", async () => {
  const key = newKey("lease-race");
  const consumers = [newPool(2), newPool(2)];
  let runs = 0;
  try {
    const settled = await Promise.allSettled(consumers.map((p) => withLease(p, key, async (lease) => {
      runs++;
      await sleep(300);
      return { sent: lease.key };
    }, { ttlMs: 5000, scope: "node-lease" })));
    assert.equal(runs, 1);
    const ok = settled.filter((s) => s.status === "fulfilled");
    const busy = settled.filter((s) => s.status === "rejected" && s.reason instanceof InProgressError);
    assert.equal(ok.length, 1);
    assert.equal(busy.length, 1);
    const again = await withLease(pool, key, async () => { throw new Error("ran for a duplicate"); }, { scope: "node-lease" });
    assert.deepEqual(again, { result: { sent: key }, replayed: true, attempts: 1 });
  } finally {
    await Promise.all(consumers.map((p) => p.end()));
  }
});

test("heartbeats keep a short lease alive through a long handler", async () => {
  const key = newKey("beats");
  const errors = [];
  const r = await withLease(pool, key, async (lease, signal) => {
    for (let i = 0; i < 10; i++) {
      const c = await claim(pool, key, { ttlMs: 1000 });
      assert.equal(c.outcome, "in_progress", "someone else claimed a key whose lease was kept alive");
      await sleep(150);
    }
    assert.equal(signal.aborted, false);
    return "done";
  }, { ttlMs: 400, heartbeatMs: 100, onHeartbeatError: (e) => errors.push(e) });
  assert.deepEqual(errors, []);
  assert.equal(r.result, "done");
  assert.deepEqual(await status(pool, key), { status: "completed", attempts: 1 });
});

test("lease lost (short ttl, no heartbeats): the stale completion is a LeaseLostError around 55006", async () => {
  const key = newKey("lost");
  let takeover;
  await assert.rejects(withLease(pool, key, async (lease) => {
    await sleep(400); // the 200 ms lease expires
    takeover = await withLease(pool, key, async (l2) => {
      assert.ok(BigInt(l2.token) > BigInt(lease.token));
      return "taken over";
    }, { ttlMs: 5000 });
    return "stale";
  }, { ttlMs: 200, heartbeatMs: 0 }), (err) => {
    assert.ok(err instanceof LeaseLostError);
    assert.equal(err.op, "idem_complete");
    assert.equal(sqlState(err), "55006");
    assert.equal(err.cause.code, "55006");
    assert.equal(isRetryable(err), false);
    return true;
  });
  assert.equal(takeover.replayed, false);
  const r = await withLease(pool, key, async () => "again");
  assert.deepEqual(r, { result: "taken over", replayed: true, attempts: 2 });
});

test("lease lost seen by a heartbeat aborts the handler's signal", async () => {
  const key = newKey("lost-beat");
  const t0 = Date.now();
  let abortedAfter = null;
  await assert.rejects(withLease(pool, key, async (lease, signal) => {
    await sleep(300);
    const c = await claim(pool, key, { ttlMs: 10000 }); // the takeover
    assert.equal(c.outcome, "claimed");
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, 5000);
      signal.addEventListener("abort", () => { abortedAfter = Date.now() - t0; clearTimeout(timer); resolve(); });
    });
    return "never";
  }, { ttlMs: 200, heartbeatMs: 500 }), (err) => err instanceof LeaseLostError && err.op === "idem_heartbeat");
  assert.ok(abortedAfter !== null && abortedAfter < 2000, `aborted after ${abortedAfter} ms`);
});

// A pool whose heartbeats fail while `broken` is set: they throw a real database error (22012), as a
// broken connection would throw its own.
function flakyDb(pool) {
  const db = {
    broken: false, failures: 0,
    async query(text, values) {
      if (db.broken && text.includes("idem_heartbeat")) {
        db.failures++;
        await pool.query("SELECT 1/0");
      }
      return pool.query(text, values);
    },
  };
  return db;
}

for (const op of ["idem_heartbeat", "idem_complete"]) {
  test(`heartbeats that failed (no onHeartbeatError) are carried by the lease loss that follows (${op})`, async () => {
    const key = newKey(`lost-after-failed-beats-${op}`);
    const db = flakyDb(pool);
    await assert.rejects(withLease(db, key, async (lease, signal) => {
      db.broken = true;
      await sleep(300); // the 200 ms lease runs out: no heartbeat gets through
      const c = await claim(pool, key, { ttlMs: 10000 }); // the takeover
      assert.equal(c.outcome, "claimed");
      if (op === "idem_complete") {
        await sleep(100); // heartbeats still failing; completion finds the loss
        return "stale";
      }
      db.broken = false; // the next heartbeat gets through, and finds the new token
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, 5000);
        signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); });
      });
      return "never";
    }, { ttlMs: 200, heartbeatMs: 60 }), (err) => {
      assert.ok(err instanceof LeaseLostError, String(err));
      assert.equal(err.op, op);
      assert.ok(db.failures > 0);
      assert.equal(sqlState(err), "55006");          // cause: pg's 55006, as before
      assert.equal(err.heartbeatError?.code, "22012", `heartbeatError: ${err.heartbeatError}`);
      assert.match(err.message, /after a failed heartbeat: division by zero/);
      return true;
    });
  });
}

test("failures: released, then terminal, then FailedError from the claim", async () => {
  const key = newKey("lease-fail");
  await assert.rejects(withLease(pool, key, async () => { throw new Error("SMTP 451"); }),
    (err) => err instanceof HandlerError && err.outcome === "released" && err.cause.message === "SMTP 451");
  await assert.rejects(withLease(pool, key, async () => { throw permanent(new Error("no such mailbox")); }),
    (err) => err instanceof HandlerError && err.terminal);
  await assert.rejects(withLease(pool, key, async () => { throw new Error("ran"); }),
    (err) => err instanceof FailedError && err.claim.attempts === 2 && err.claim.payload.error === "no such mailbox");
});
