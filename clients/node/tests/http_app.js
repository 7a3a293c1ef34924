// The HTTP server of the tests/http*.test.js, an Express 5 app behind the idempotency middleware, run in a
// process of its own (which the tests kill -9, freeze and restart): node tests/http_app.js, with
// IDEM_HTTP_LISTEN (port), IDEM_HTTP_APP_NAME (the application_name of its database sessions),
// IDEM_HTTP_LEASE_MS and the PG* variables of clients/node/test.
//
// Routes: POST /orders (key required, one transaction), POST /payments (key required, two transactions),
// POST /notes (key optional), POST /payments-unbeaten (two transactions, a lease of 1 s without heartbeats,
// through a second middleware), POST /_test/gates/:name (opens a gate), GET /_test/health. The handler
// records each run in http_runs through the pool (so that a run rolled back or killed still counts), writes
// its business row in http_orders through the request's transaction, and obeys X-Test-Fail (raise | 500),
// X-Test-Gate (waits until the gate is opened) and X-Test-Block (waits until the client goes: the test kills
// the server). The scope is the X-Tenant header when given. The body is parsed by express.json() after the
// middleware, which read it first.
import express from "express";
import pg from "pg";
import { idempotency, idempotencyOf } from "../dist/index.js";

const pool = new pg.Pool({ max: 20, application_name: process.env.IDEM_HTTP_APP_NAME });
const gates = new Map();
const gate = (name) => {
  if (!gates.has(name)) {
    let open;
    const opened = new Promise((resolve) => { open = resolve; });
    gates.set(name, { opened, open });
  }
  return gates.get(name);
};

async function order(req, res) {
  const idem = idempotencyOf(req);
  const { rows: [{ pid }] } = await idem.client.query("SELECT pg_backend_pid() AS pid");
  await pool.query(`INSERT INTO http_runs (idem_key, scope, mode, token, server_pid, backend_pid)
                    VALUES ($1, $2, $3, $4, $5, $6)`, [idem.key, idem.scope, idem.mode, idem.token, process.pid, pid]);
  const { rows: [o] } = await idem.client.query(
    "INSERT INTO http_orders (idem_key, scope, item) VALUES ($1, $2, $3) RETURNING id", [idem.key, idem.scope, req.body.item]);
  if (req.get("x-test-gate")) await gate(req.get("x-test-gate")).opened;
  if (req.get("x-test-block")) return new Promise((resolve) => res.once("close", resolve));
  if (req.get("x-test-fail") === "raise") throw new Error("the handler failed");
  if (req.get("x-test-fail") === "500") return res.status(500).send("failed on purpose");
  res.status(201).location(`/orders/${o.id}`).set("X-Custom", "first-run-only").json({ id: o.id, item: req.body.item });
}

const app = express();
app.use(idempotency({
  pool,
  routes: [{ method: "POST", path: "/orders", require: true },
           { method: "POST", path: "/payments", require: true, mode: "two-transactions" },
           { method: "POST", path: "/notes" }],
  leaseMs: Number(process.env.IDEM_HTTP_LEASE_MS || 3000),
  scope: (req) => req.headers["x-tenant"],
  maxBodyBytes: 1024,
}));
const unbeaten = idempotency({ pool, routes: [{ method: "POST", path: "/**", require: true }],
                               mode: "two-transactions", leaseMs: 1000, heartbeatMs: 0 });
app.post("/payments-unbeaten", unbeaten, express.json(), order);
app.post(["/orders", "/payments", "/notes"], express.json(), order);
app.post("/_test/gates/:name", (req, res) => { gate(req.params.name).open(); res.send("open"); });
app.get("/_test/health", (req, res) => res.send("ok"));
app.listen(Number(process.env.IDEM_HTTP_LISTEN), "127.0.0.1");
