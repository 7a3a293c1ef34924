import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import pg from "pg";
import { idemKey, fingerprint, fingerprintText, canonicalJSON, jsonPointer, MAX_DEPTH, DocumentTooDeepError } from "../dist/index.js";

// clients/vectors.json: the vectors every client library and the SQL functions must agree on.
// IDEM_VECTORS names another copy (e.g. the SQL side's).
const vectorsPath = process.env.IDEM_VECTORS || new URL("../../vectors.json", import.meta.url);
const vectors = JSON.parse(readFileSync(vectorsPath, "utf8"));

test("key vectors", () => {
  assert.ok(vectors.keys.length > 0);
  for (const [i, v] of vectors.keys.entries()) {
    assert.equal(idemKey(v.namespace, ...v.parts), v.key, `keys[${i}] ${JSON.stringify(v.parts)}`);
  }
});

test("fingerprint vectors", () => {
  assert.ok(vectors.fingerprints.length > 0);
  for (const [i, v] of vectors.fingerprints.entries()) {
    assert.equal(fingerprint(v.document, v.paths), v.fingerprint,
                 `fingerprints[${i}] ${JSON.stringify(v.document)} ${JSON.stringify(v.paths)}`);
  }
});

// The documents of the refused vectors: `nest` arrays (or objects {"a": ...}) around 1.
function nestedText(n, kind) {
  return kind === "array" ? "[".repeat(n) + "1" + "]".repeat(n) : '{"a":'.repeat(n) + "1" + "}".repeat(n);
}
function nested(n, kind) {
  let doc = 1;
  for (let i = 0; i < n; i++) doc = kind === "array" ? [doc] : { a: doc };
  return doc;
}

test("deep documents are refused with 54000", () => {
  assert.equal(MAX_DEPTH, 100);
  assert.ok(vectors.refused.length >= 4);
  for (const [i, v] of vectors.refused.entries()) {
    for (const run of [() => fingerprint(nested(v.nest, v.kind), v.paths), () => fingerprintText(nestedText(v.nest, v.kind), v.paths)]) {
      assert.throws(run, (e) => e instanceof DocumentTooDeepError && e.code === v.sqlstate && v.sqlstate === "54000",
                    `refused[${i}] ${v.nest} ${v.kind}`);
    }
  }
  assert.equal(fingerprintText(nestedText(MAX_DEPTH, "array")), fingerprint(nested(MAX_DEPTH, "array")));
});

test("key: UUID v5 of length-prefixed parts", () => {
  const ns = "6ba7b811-9dad-11d1-80b4-00c04fd430c8";
  const k = idemKey(ns, "orders", "42");
  assert.match(k, /^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  // by hand: SHA-1 of the namespace bytes and "6:orders;2:42;"
  const h = createHash("sha1").update(Buffer.from(ns.replace(/-/g, ""), "hex")).update("6:orders;2:42;").digest("hex");
  assert.equal(k.replace(/-/g, "").slice(0, 12), h.slice(0, 12));
  assert.notEqual(idemKey(ns, "a;b"), idemKey(ns, "a", "b"));
  assert.throws(() => idemKey(ns), TypeError);
  assert.throws(() => idemKey("not-a-uuid", "x"), TypeError);
  assert.throws(() => idemKey(ns, null), TypeError);
});

test("canonical JSON (RFC 8785)", () => {
  assert.equal(canonicalJSON(JSON.parse('{"b":[1, 2.50, {"z":null,"y":true}], "a":"x"}')),
               '{"a":"x","b":[1,2.5,{"y":true,"z":null}]}');
  assert.equal(canonicalJSON(JSON.parse("[1E30, 4.50, 2e-3, 1e-27, -0, 1e21, 1e20, 1e-7, 1e-6, 9007199254740993]")),
               "[1e+30,4.5,0.002,1e-27,0,1e+21,100000000000000000000,1e-7,0.000001,9007199254740992]");
  // members sorted by UTF-16 code units: U+1F600 (D83D DE00) before U+FB33
  assert.equal(canonicalJSON({ "\ufb33": 1, "\u{1F600}": 2, "\r": 3, "1": 4, "\u00f6": 5 }),
               '{"\\r":3,"1":4,"ö":5,"\u{1F600}":2,"\ufb33":1}');
});

test("fingerprint over paths", () => {
  const doc = { order: { id: 1, amount: 19.9, note: "x" }, items: [{ sku: "a" }] };
  assert.equal(fingerprint(doc, ["/order/id", "/order/amount"]),
               fingerprintText('{"items": [], "order": {"note": "y", "amount": 19.90, "id": 1}}', ["/order/amount", "/order/id"]));
  assert.notEqual(fingerprint(doc), fingerprint(doc, [""]));
  assert.equal(jsonPointer(doc, "/items/0/sku"), "a");
  assert.equal(jsonPointer(doc, "/items/01"), null);
  assert.equal(jsonPointer({}, "/constructor"), null); // own members only
  assert.throws(() => fingerprint(doc, ["order"]), TypeError);
  assert.equal(fingerprint(JSON.parse('{"__proto__": 1}'), ["/__proto__"]),
               createHash("sha256").update('{"/__proto__":1}').digest("hex"));
});

test("the extension's idem_key / idem_fingerprint agree with the vectors", async () => {
  const client = new pg.Client();
  await client.connect();
  try {
    const { rows: [r] } = await client.query(
      "SELECT to_regprocedure('idem_key(uuid, text[])') IS NOT NULL AND to_regprocedure('idem_fingerprint(jsonb, text[])') IS NOT NULL AS have");
    assert.ok(r.have, "the installed extension has no idem_key(uuid, text[]) / idem_fingerprint(jsonb, text[]) " +
                      "(0.3.0 on): the vectors cannot be checked against SQL");
    const raw = readFileSync(vectorsPath, "utf8");
    for (const [i, v] of vectors.keys.entries()) {
      const { rows: [k] } = await client.query("SELECT idem_key($1::uuid, VARIADIC $2::text[]) AS k", [v.namespace, v.parts]);
      assert.equal(k.k, v.key, `SQL keys[${i}]`);
    }
    // the documents as jsonb, from the file's own text (numbers exactly as written)
    const { rows } = await client.query(
      `SELECT ord - 1 AS i, idem_fingerprint(f -> 'document', VARIADIC ARRAY(SELECT jsonb_array_elements_text(f -> 'paths'))) AS fp
         FROM jsonb_array_elements($1::jsonb -> 'fingerprints') WITH ORDINALITY AS t(f, ord)`, [raw]);
    for (const row of rows) assert.equal(row.fp, vectors.fingerprints[row.i].fingerprint, `SQL fingerprints[${row.i}]`);
  } finally {
    await client.end();
  }
});
