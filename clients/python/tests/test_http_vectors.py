"""The HTTP contract shared with clients/go and clients/node (clients/http-vectors.json), without a server:
Idempotency-Key fields, default fingerprints, stored responses and their replay, route patterns; and the
problem documents."""
import base64
import json
import pathlib

import pytest

from idempotency_client._http import (KeyFieldError, Route, find_route, parse_key, path_matches, problem,
                                      replayed_response, request_fingerprint, stored_response)

VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "http-vectors.json").read_text())


@pytest.mark.parametrize("case", VECTORS["idempotency_key"], ids=lambda c: c["why"][:40])
def test_idempotency_key_field(case):
    if case.get("error"):
        with pytest.raises(KeyFieldError):
            parse_key(case["field"])
    else:
        assert parse_key(case["field"]) == case["key"]


def test_fingerprints():
    assert len(VECTORS["fingerprints"]) >= 5
    for c in VECTORS["fingerprints"]:
        body = base64.b64decode(c["body_base64"])
        assert request_fingerprint(c["method"], c["target"], body) == c["fingerprint"], c


def test_stored_responses_and_their_replay():
    for c in VECTORS["stored_responses"]:
        body = base64.b64decode(c["body_base64"])
        doc = stored_response(c["status"], [tuple(h) for h in c["headers"]] + [("X-Other", "dropped")], body,
                              ("Content-Type", "location"))
        assert doc == c["stored"]
        assert json.loads(json.dumps(doc)) == doc
        status, headers, replayed = replayed_response(doc)
        assert (status, replayed) == (c["status"], body)
        assert headers == [tuple(h) for h in c["headers"]] + [("idempotent-replayed", "true")]


def test_route_patterns():
    for c in VECTORS["routes"]:
        assert path_matches(c["pattern"], c["path"]) is c["match"], c
    routes = [Route("POST", "/orders", require=True), Route("*", "/orders/**")]
    assert find_route(routes, "post", "/orders").require
    assert find_route(routes, "DELETE", "/orders/7") is routes[1]
    assert find_route(routes, "GET", "/other") is None
    with pytest.raises(ValueError):
        Route("POST", "/x", mode="three")


def test_problem_documents():
    status, headers, body = problem("idempotency-key-in-use", None, retry_after=7)
    assert status == 409 and ("retry-after", "7") in headers and ("content-type", "application/problem+json") in headers
    doc = json.loads(body)
    assert doc == {"type": "about:blank", "title": "Conflict", "status": 409, "code": "idempotency-key-in-use",
                   "detail": "A request with the same Idempotency-Key is being processed; retry later."}
    _, _, body = problem("idempotency-key-missing", "https://example.com/problems/")
    doc = json.loads(body)
    assert doc["type"] == "https://example.com/problems/idempotency-key-missing"
    assert doc["title"] == "Idempotency-Key is missing"
