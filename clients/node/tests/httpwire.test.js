// The HTTP contract shared with clients/python and clients/go (clients/http-vectors.json), without a
// server: Idempotency-Key fields, default fingerprints, stored responses and their replay, route patterns;
// and the problem documents.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { KeyFieldError, parseKey, pathMatches, problem, replayedResponse, requestFingerprint,
         storedResponse } from "../dist/index.js";

const v = JSON.parse(readFileSync(new URL("../../http-vectors.json", import.meta.url), "utf8"));

test("Idempotency-Key fields", () => {
  assert.ok(v.idempotency_key.length >= 20);
  for (const c of v.idempotency_key) {
    if (c.error) assert.throws(() => parseKey(c.field), KeyFieldError, c.why);
    else assert.equal(parseKey(c.field), c.key, c.why);
  }
});

test("default fingerprints", () => {
  assert.ok(v.fingerprints.length >= 5);
  for (const c of v.fingerprints) {
    assert.equal(requestFingerprint(c.method, c.target, Buffer.from(c.body_base64, "base64")), c.fingerprint);
  }
});

test("stored responses and their replay", () => {
  for (const c of v.stored_responses) {
    const body = Buffer.from(c.body_base64, "base64");
    const headers = [...c.headers, ["x-other", "dropped"]];
    const header = (name) => headers.filter(([k]) => k === name.toLowerCase()).map(([, x]) => x);
    const doc = storedResponse(c.status, header, body, ["Content-Type", "location"]);
    assert.deepEqual(doc, c.stored);
    const r = replayedResponse(JSON.parse(JSON.stringify(doc)));
    assert.equal(r.status, c.status);
    assert.ok(r.body.equals(body));
    assert.deepEqual(r.headers, [...c.headers, ["idempotent-replayed", "true"]]);
  }
});

test("route patterns", () => {
  for (const c of v.routes) assert.equal(pathMatches(c.pattern, c.path), c.match, `${c.pattern} ~ ${c.path}`);
});

test("problem documents", () => {
  const p = problem("idempotency-key-in-use");
  assert.equal(p.status, 409);
  assert.deepEqual(JSON.parse(p.body), { type: "about:blank", title: "Conflict", status: 409, code: "idempotency-key-in-use",
                                        detail: "A request with the same Idempotency-Key is being processed; retry later." });
  const q = JSON.parse(problem("idempotency-key-missing", "https://example.com/problems/").body);
  assert.equal(q.type, "https://example.com/problems/idempotency-key-missing");
  assert.equal(q.title, "Idempotency-Key is missing");
});
