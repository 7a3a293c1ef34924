package idem_test

// The net/http middleware (idem.HTTP) in real server processes (httpapp_test.go), driven by net/http's
// client over TCP, against the test cluster: concurrency, replays, 400 / 409 / 413 / 422, rollback of
// failed handlers, scopes. The kill -9 runs are in http_kill_test.go.

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

func TestHTTPFiftyConcurrentRequestsWithOneKey(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	replies := make(chan reply, 50)
	for i := 0; i < 50; i++ {
		go func() { replies <- post(s.url, "/orders", key, book, "X-Test-Gate", key) }()
	}
	for i := 0; i < 49; i++ { // the holder waits at its gate: the 49 others answer first
		r := <-replies
		wantProblem(t, r, 409, "idempotency-key-in-use")
		if n, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || n < 1 {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
	}
	post(s.url, "/_test/gates/"+key, "", nil)
	first := <-replies
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v %s", first.status, first.err, first.body)
	}
	for i := 0; i < 5; i++ {
		go func() { replies <- post(s.url, "/orders", key, book) }()
	}
	for i := 0; i < 5; i++ {
		wantReplay(t, <-replies, first)
	}
	if c := counts(t, key, "http"); c != [2]int{1, 1} {
		t.Fatalf("runs, rows = %v", c)
	}
}

func TestHTTPSequentialRetriesReplay(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	first := post(s.url, "/orders", key, book)
	if first.status != 201 || first.header.Get("X-Custom") != "first-run-only" {
		t.Fatalf("%d %v %s", first.status, first.err, first.body)
	}
	for i := 0; i < 3; i++ {
		r := post(s.url, "/orders", key, book)
		wantReplay(t, r, first)
		for _, h := range []string{"Location", "Content-Type"} {
			if r.header.Get(h) != first.header.Get(h) {
				t.Fatalf("%s: %q, first %q", h, r.header.Get(h), first.header.Get(h))
			}
		}
		if r.header.Get("X-Custom") != "" {
			t.Fatal("X-Custom is not among the kept headers")
		}
	}
	if c := counts(t, key, "http"); c != [2]int{1, 1} {
		t.Fatalf("runs, rows = %v", c)
	}
}

func TestHTTPReusedKeyWithAnotherRequestIs422(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	if r := post(s.url, "/orders", key, book); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	wantProblem(t, post(s.url, "/orders", key, map[string]string{"item": "lamp"}), 422, "idempotency-key-reused")
	wantProblem(t, post(s.url, "/notes", key, book), 422, "idempotency-key-reused") // another path
	if c := counts(t, key, "http"); c != [2]int{1, 1} {
		t.Fatalf("runs, rows = %v", c)
	}
}

func TestHTTPKeyMissingInvalidOrRepeatedIs400(t *testing.T) {
	s := httpServer(t, 0)
	before := queryInt(t, "SELECT count(*) FROM http_runs")
	wantProblem(t, post(s.url, "/orders", "", book), 400, "idempotency-key-missing")
	for _, field := range []string{"abc", `"a" "b"`, `""`, `"` + strings.Repeat("k", 256) + `"`} {
		doc := wantProblem(t, post(s.url, "/orders", "", book, "Idempotency-Key", field), 400, "idempotency-key-invalid")
		if doc["detail"] == "" {
			t.Fatal("no detail")
		}
	}
	wantProblem(t, post(s.url, "/orders", "", book, "Idempotency-Key", `"a"`, "Idempotency-Key", `"b"`), 400,
		"idempotency-key-invalid")
	if n := queryInt(t, "SELECT count(*) FROM http_runs"); n != before {
		t.Fatalf("the handler ran %d times", n-before)
	}
	a, b := post(s.url, "/notes", "", book), post(s.url, "/notes", "", book) // key optional: runs each time
	if a.status != 201 || b.status != 201 || string(a.body) == string(b.body) {
		t.Fatalf("%d %s / %d %s", a.status, a.body, b.status, b.body)
	}
}

func TestHTTPFailedHandlerLeavesNoRowAndNoKey(t *testing.T) {
	s := httpServer(t, 0)
	for _, how := range []string{"raise", "500"} {
		key := newKey(t)
		if r := post(s.url, "/orders", key, book, "X-Test-Fail", how); r.status != 500 {
			t.Fatalf("%s: %d %v %s", how, r.status, r.err, r.body)
		}
		if c := counts(t, key, "http"); c != [2]int{1, 0} {
			t.Fatalf("%s: runs, rows = %v", how, c)
		}
		if n := queryInt(t, "SELECT count(*) FROM idem_status($1, 'http')", key); n != 0 {
			t.Fatalf("%s: the key is still there", how)
		}
		if r := post(s.url, "/orders", key, book); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s: retry %d %s", how, r.status, r.body)
		}
		if c := counts(t, key, "http"); c != [2]int{2, 1} {
			t.Fatalf("%s: runs, rows = %v", how, c)
		}
	}
}

func TestHTTPBodyOverTheLimitIs413(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	wantProblem(t, post(s.url, "/orders", key, map[string]string{"item": strings.Repeat("x", 2000)}), 413,
		"request-too-large")
	// no Content-Length: counted while read
	req, _ := http.NewRequest("POST", s.url+"/orders", strings.NewReader(strings.Repeat(" ", 2000)))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", sf(key))
	resp, err := client.Do(req)
	if err != nil || resp.StatusCode != 413 {
		t.Fatalf("chunked: %v %v", resp, err)
	}
	resp.Body.Close()
	if c := counts(t, key, "http"); c != [2]int{0, 0} {
		t.Fatalf("runs, rows = %v", c)
	}
}

func TestHTTPScopesKeepTenantsApart(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	a := post(s.url, "/orders", key, book, "X-Tenant", "acme")
	b := post(s.url, "/orders", key, book, "X-Tenant", "globex")
	if a.status != 201 || b.status != 201 || string(a.body) == string(b.body) {
		t.Fatalf("%d %s / %d %s", a.status, a.body, b.status, b.body)
	}
	wantReplay(t, post(s.url, "/orders", key, book, "X-Tenant", "acme"), a)
	if counts(t, key, "acme") != [2]int{1, 1} || counts(t, key, "globex") != [2]int{1, 1} ||
		counts(t, key, "http") != [2]int{0, 0} {
		t.Fatal("scopes mixed")
	}
}

func TestHTTPTwoTransactionsFailureReleasesAndConflictTellsTheLease(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	if r := post(s.url, "/payments", key, book, "X-Test-Fail", "500"); r.status != 500 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if !queryBool(t, `SELECT status = 'pending' AND token IS NULL AND error = '{"error": "status", "status": 500}'
	                    FROM idem_status($1, 'http')`, key) {
		t.Fatal("not released with the status as its error")
	}
	held := make(chan reply, 1)
	go func() { held <- post(s.url, "/payments", key, book, "X-Test-Gate", key) }()
	poll(t, "the second run to start", func() bool { return counts(t, key, "http")[0] == 2 })
	busy := post(s.url, "/payments", key, book)
	wantProblem(t, busy, 409, "idempotency-key-in-use")
	if n, _ := strconv.Atoi(busy.header.Get("Retry-After")); n < 1 || n > 3 {
		t.Fatalf("Retry-After %q: not from the 3 s lease", busy.header.Get("Retry-After"))
	}
	post(s.url, "/_test/gates/"+key, "", nil)
	if r := <-held; r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if c := counts(t, key, "http"); c != [2]int{2, 1} {
		t.Fatalf("runs, rows = %v", c)
	}
}
