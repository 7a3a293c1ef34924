package idem_test

// The HTTP contract shared with clients/python and clients/node (clients/http-vectors.json), without a
// server: Idempotency-Key fields, default fingerprints, stored responses and their replay, route
// patterns; and the problem documents.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"reflect"
	"testing"

	"idempotency/clients/go/idem"
)

type httpVectors struct {
	Keys []struct {
		Field string `json:"field"`
		Why   string `json:"why"`
		Key   string `json:"key"`
		Error bool   `json:"error"`
	} `json:"idempotency_key"`
	Fingerprints []struct {
		Method, Target, Fingerprint string
		BodyBase64                  string `json:"body_base64"`
	} `json:"fingerprints"`
	Stored []struct {
		Status     int             `json:"status"`
		Headers    [][2]string     `json:"headers"`
		BodyBase64 string          `json:"body_base64"`
		Stored     json.RawMessage `json:"stored"`
	} `json:"stored_responses"`
	Routes []struct {
		Pattern, Path string
		Match         bool
	} `json:"routes"`
}

func loadHTTPVectors(t *testing.T) httpVectors {
	t.Helper()
	raw, err := os.ReadFile("../http-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v httpVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Keys) < 20 || len(v.Fingerprints) < 5 || len(v.Stored) < 5 || len(v.Routes) < 10 {
		t.Fatal("clients/http-vectors.json: vectors missing")
	}
	return v
}

func TestHTTPVectors(t *testing.T) {
	v := loadHTTPVectors(t)
	for _, c := range v.Keys {
		key, err := idem.ParseKey(c.Field, 0)
		var kfe *idem.KeyFieldError
		switch {
		case c.Error && !errors.As(err, &kfe):
			t.Errorf("%s: %q parsed as %q", c.Why, c.Field, key)
		case !c.Error && (err != nil || key != c.Key):
			t.Errorf("%s: %q: %q, %v; want %q", c.Why, c.Field, key, err, c.Key)
		}
	}
	for _, c := range v.Fingerprints {
		body, _ := base64.StdEncoding.DecodeString(c.BodyBase64)
		if got := idem.RequestFingerprint(c.Method, c.Target, body); got != c.Fingerprint {
			t.Errorf("%s %s: %s, want %s", c.Method, c.Target, got, c.Fingerprint)
		}
	}
	for _, c := range v.Stored {
		body, _ := base64.StdEncoding.DecodeString(c.BodyBase64)
		h := http.Header{"X-Other": {"dropped"}}
		for _, kv := range c.Headers {
			h.Add(kv[0], kv[1])
		}
		sr := idem.NewStoredResponse(c.Status, h, body, []string{"Content-Type", "location"})
		got, _ := json.Marshal(sr)
		var a, b interface{}
		_ = json.Unmarshal(got, &a)
		_ = json.Unmarshal(c.Stored, &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("stored %s, want %s", got, c.Stored)
		}
		status, header, replayed, err := sr.Replay()
		if err != nil || status != c.Status || !bytes.Equal(replayed, body) || header.Get("Idempotent-Replayed") != "true" ||
			len(header) != len(c.Headers)+1 {
			t.Errorf("replay of %s: %d %v %q %v", got, status, header, replayed, err)
		}
	}
	for _, c := range v.Routes {
		if idem.PathMatches(c.Pattern, c.Path) != c.Match {
			t.Errorf("%q ~ %q: want %v", c.Pattern, c.Path, c.Match)
		}
	}
}

func TestHTTPProblemDocuments(t *testing.T) {
	status, body := idem.Problem("idempotency-key-in-use", "", "")
	var doc map[string]interface{}
	_ = json.Unmarshal(body, &doc)
	want := map[string]interface{}{"type": "about:blank", "title": "Conflict", "status": 409.0,
		"code": "idempotency-key-in-use", "detail": "A request with the same Idempotency-Key is being processed; retry later."}
	if status != 409 || !reflect.DeepEqual(doc, want) {
		t.Fatalf("%d %v", status, doc)
	}
	_, body = idem.Problem("idempotency-key-missing", "https://example.com/problems/", "")
	_ = json.Unmarshal(body, &doc)
	if doc["type"] != "https://example.com/problems/idempotency-key-missing" || doc["title"] != "Idempotency-Key is missing" {
		t.Fatalf("%v", doc)
	}
}
