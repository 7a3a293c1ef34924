// Shared by the tests: the database of clients/node/test's throwaway cluster (PGHOST, PGPORT, PGUSER,
// PGDATABASE are set by that script; pg reads them).
import pg from "pg";

if (!process.env.PGDATABASE) {
  throw new Error("PGDATABASE is not set: run clients/node/test, which starts a cluster with the extension");
}

export function newPool(max = 8) {
  return new pg.Pool({ max });
}

let seq = 0;
export function newKey(name) {
  return `${name}-${process.pid}-${Date.now()}-${++seq}`;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function setupLedger(pool) {
  await pool.query("CREATE TABLE IF NOT EXISTS ledger (key text NOT NULL, note text)");
}

export async function ledgerRows(pool, key) {
  const { rows: [r] } = await pool.query("SELECT count(*)::int AS n FROM ledger WHERE key = $1", [key]);
  return r.n;
}

export async function status(pool, key, scope = "default") {
  const { rows: [r] } = await pool.query("SELECT status, attempts FROM idem_status($1, $2)", [key, scope]);
  return r;
}
