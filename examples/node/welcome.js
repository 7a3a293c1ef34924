// Node: the guard pattern (pg + kafkajs) — claim, process, complete, release on error.
//
// The usual Redis recipe (SET key NX EX 30, do the work, DEL on error) is replaced by the extension,
// through the project's Node client (clients/node, `idempotency-client`): the claim is a lease with a
// fencing token in PostgreSQL, kept alive by heartbeats while the work runs, the result is stored with
// the key, and a failed attempt is released for the next delivery instead of being lost or done twice.
// The side effect here is a welcome e-mail sent through a flaky mailer outside the database
// (two-transaction mode: withLease; for work inside the database, see the client's guard/eachMessage).
//
// Run: examples/node/run   (produces its own sign-ups, duplicates included, and checks the outbox).
import kafkajs from "kafkajs";
import pg from "pg";
import { withLease, HandlerError, InProgressError, isTerminal } from "idempotency-client";

const { Kafka, logLevel } = kafkajs;
const run = Date.now();
const topic = `signups-${run}`;
const pool = new pg.Pool({ host: process.env.IDEM_SOCKDIR, port: Number(process.env.IDEM_PORT),
                           database: "ex_node", user: "postgres", max: 4 });

// The guard: `work(attempt)` runs at most once successfully per key; a duplicate gets the stored result
// back; a thrown error releases the key (idem_fail, retryable) and comes back as a HandlerError, which
// the consumer rethrows so that the broker redelivers and the next attempt can claim the key again.
async function guard(key, work) {
  try {
    const r = await withLease(pool, key, (lease) => work(lease.key), { scope: "emails", ttlMs: 30_000 });
    return { replayed: r.replayed, result: r.result };
  } catch (err) {
    if (isTerminal(err)) return { deadLetter: true, error: err.message };   // failed: dead-letter it
    throw err; // InProgressError (another consumer holds the lease), HandlerError (released), DB errors
  }
}

// The outside world: a mailer that fails the first attempt for every 5th user.
const outbox = [];
const flaky = new Set();
async function sendWelcome(user, key) {
  if (user.id % 5 === 0 && !flaky.has(user.id)) {
    flaky.add(user.id);
    throw new Error(`SMTP 451 for ${user.email}, try again`);
  }
  outbox.push(user.email);
  return { messageId: `msg-${user.id}`, idempotencyKey: key }; // the key goes on to the provider
}

const kafka = new Kafka({ clientId: "welcome-mailer", brokers: [process.env.KAFKA_BOOTSTRAP],
                          logLevel: process.env.KAFKAJS_LOG ? (process.env.KAFKAJS_LOG === "debug" ? logLevel.DEBUG : logLevel.INFO) : logLevel.NOTHING });
const admin = kafka.admin();
await admin.connect();
await admin.createTopics({ topics: [{ topic, numPartitions: 2 }] });
await admin.disconnect();

// 30 sign-ups; every 3rd is produced twice (a producer retry).
const producer = kafka.producer();
await producer.connect();
const records = [];
for (let id = 1; id <= 30; id++) {
  const value = JSON.stringify({ id, email: `user${id}@example.com` });
  const msg = { key: `user-${id}`, value, headers: { "idempotency-key": `welcome-${id}` } };
  records.push(msg);
  if (id % 3 === 0) records.push(msg);
}
// one message per request, so one record per batch: tansu 0.6 cannot fetch from an offset inside a
// batch, which is where kafkajs resumes after a failed message (see examples/README.md)
for (const m of records) await producer.send({ topic, messages: [m] });
await producer.disconnect();

const stats = { sent: 0, replayed: 0, released: 0 };
const consumer = kafka.consumer({ groupId: `mailer-${run}`, retry: { initialRetryTime: 100, retries: 8 } });
await consumer.connect();
await consumer.subscribe({ topic, fromBeginning: true });
let seen = 0;
const finished = new Promise((resolve) => {
  consumer.run({
    eachMessage: async ({ message }) => {
      const key = message.headers["idempotency-key"].toString();
      const user = JSON.parse(message.value.toString());
      try {
        const r = await guard(key, (k) => sendWelcome(user, k));
        if (r.replayed) stats.replayed++; else stats.sent++;
      } catch (err) {
        stats.released++;
        const why = err instanceof HandlerError ? `released (${err.cause.message})`
          : err instanceof InProgressError ? "in progress elsewhere" : err.message;
        console.log(`  ${key}: ${why}`);
        throw err; // kafkajs retries this message
      }
      if (++seen === records.length) resolve();
    },
  });
});
await finished;
await consumer.disconnect();

const keys = Array.from({ length: 30 }, (_, i) => `welcome-${i + 1}`);
const { rows: [db] } = await pool.query(
  "SELECT count(*)::int AS n, max(s.attempts) AS max_attempts FROM unnest($1::text[]) AS k, " +
  "idem_status(k, 'emails') AS s WHERE s.status = 'completed'", [keys]);
await pool.end();
const unique = new Set(outbox).size;
const ok = outbox.length === 30 && unique === 30 && stats.replayed === 10 && stats.released === 6 && db.n === 30;
console.log(`node: ${records.length} records, ${outbox.length} e-mails sent to ${unique} users, ` +
            `${stats.replayed} duplicates replayed, ${stats.released} failures released and retried ` +
            `(max attempts ${db.max_attempts}): ${ok ? "OK" : "WRONG"}`);
process.exit(ok ? 0 : 1);
