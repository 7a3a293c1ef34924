package idem_test

// kill -9 of the HTTP server in the middle of a handler, then a restart, in both modes; each prints its
// counts: requests sent, handler runs, business rows, replays (and 409s). Then a server frozen (SIGSTOP)
// in a two-transaction handler past its lease while the second server takes the key over: thawed, its
// completion is refused by the fencing token and its writes roll back (before the freeze, its heartbeats
// keep the lease past its first end); and a handler without heartbeats whose lease was taken over,
// whose completion is refused.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgconn"
)

// killInHandler sends a request whose handler blocks, waits until the handler runs, kills the server and
// checks that the request got no answer.
func killInHandler(t *testing.T, s *server, path, key string) {
	t.Helper()
	pending := make(chan reply, 1)
	go func() { pending <- post(s.url, path, key, book, "X-Test-Block", "1") }()
	poll(t, "the handler to start", func() bool { return counts(t, key, "http")[0] == 1 })
	s.kill(t)
	if r := <-pending; r.err == nil {
		t.Fatalf("the killed server answered %d", r.status)
	}
}

func TestHTTPKillInOneTransactionMode(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	killInHandler(t, s, "/orders", key)
	if c := counts(t, key, "http"); c != [2]int{1, 0} || queryInt(t, "SELECT count(*) FROM idem_status($1, 'http')", key) != 0 {
		t.Fatalf("after the kill: runs, rows = %v, or the key is left", c)
	}
	s.start(t)
	first := post(s.url, "/orders", key, book)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %v %s", first.status, first.err, first.body)
	}
	wantReplay(t, post(s.url, "/orders", key, book), first)
	c := counts(t, key, "http")
	if c != [2]int{2, 1} {
		t.Fatalf("runs, rows = %v", c)
	}
	fmt.Printf("  kill -9 (one transaction, go): requests 3, handler runs %d, business rows %d, replays 1\n", c[0], c[1])
}

func TestHTTPKillInTwoTransactionMode(t *testing.T) {
	s, other := httpServer(t, 0), httpServer(t, 1)
	key := newKey(t)
	killInHandler(t, s, "/payments", key)
	var oldToken int64
	var ends time.Time
	if err := pool.QueryRow(context.Background(), `SELECT token, expires_at FROM idem_status($1, 'http') WHERE status = 'pending'`,
		key).Scan(&oldToken, &ends); err != nil {
		t.Fatal(err)
	}
	leaseOn := func() bool { return queryBool(t, "SELECT clock_timestamp() < $1", ends) }
	// The retry reaches the other instance at once, while the killed one restarts: 409 while the lease is on.
	r := post(other.url, "/payments", key, book)
	requests, conflicts := 2, 0
	if leaseOn() { // still on after the answer: it was on throughout
		wantProblem(t, r, 409, "idempotency-key-in-use")
		if n, _ := strconv.Atoi(r.header.Get("Retry-After")); n < 1 || n > 3 {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
		conflicts++
	}
	s.start(t)
	for r.status == 409 {
		wantProblem(t, r, 409, "idempotency-key-in-use")
		poll(t, "the lease to end", func() bool { return !leaseOn() })
		r = post(s.url, "/payments", key, book)
		requests++
	}
	if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("%d %v %s", r.status, r.err, r.body)
	}
	var newToken int64
	var started time.Time
	if err := pool.QueryRow(context.Background(), `SELECT token, started_at FROM http_runs WHERE idem_key = $1 AND token <> $2`,
		key, oldToken).Scan(&newToken, &started); err != nil {
		t.Fatal(err)
	}
	if newToken <= oldToken || started.Before(ends) {
		t.Fatalf("new token %d (old %d), started %v, old lease ended %v", newToken, oldToken, started, ends)
	}
	_, err := pool.Exec(context.Background(), `SELECT idem_complete($1, '{}'::jsonb, scope => 'http', token => $2)`, key, oldToken)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55006" {
		t.Fatalf("the old token's completion: %v, not 55006", err)
	}
	wantReplay(t, post(s.url, "/payments", key, book), r)
	requests++
	c := counts(t, key, "http")
	if c != [2]int{2, 1} || !queryBool(t, `SELECT status = 'completed' AND token = $2 AND attempts = 2 FROM idem_status($1, 'http')`, key, newToken) {
		t.Fatalf("runs, rows = %v, or the record is not the new token's", c)
	}
	fmt.Printf("  kill -9 (two transactions, go): requests %d, handler runs %d, business rows %d, replays 1, conflicts 409 %d\n",
		requests, c[0], c[1], conflicts)
}

func TestHTTPFrozenServerPastItsLeaseIsFencedOff(t *testing.T) {
	s, other := httpServer(t, 0), httpServer(t, 1)
	key := newKey(t)
	first := make(chan reply, 1)
	go func() { first <- post(s.url, "/payments", key, book, "X-Test-Gate", key) }()
	poll(t, "the handler to start", func() bool { return counts(t, key, "http")[0] == 1 })
	var claimedUntil time.Time
	if err := pool.QueryRow(context.Background(), `SELECT expires_at FROM idem_status($1, 'http')`, key).Scan(&claimedUntil); err != nil {
		t.Fatal(err)
	}
	poll(t, "the first lease to have run out", func() bool { return queryBool(t, "SELECT clock_timestamp() > $1", claimedUntil) })
	wantProblem(t, post(other.url, "/payments", key, book), 409, "idempotency-key-in-use") // heartbeats extend it
	s.signal(t, syscall.SIGSTOP)                                                           // no heartbeats: the lease runs out
	poll(t, "the frozen server's lease to end", func() bool {
		return queryBool(t, "SELECT expires_at < clock_timestamp() FROM idem_status($1, 'http')", key)
	})
	taken := post(other.url, "/payments", key, book)
	s.signal(t, syscall.SIGCONT)
	if taken.status != 201 || taken.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("takeover: %d %s", taken.status, taken.body)
	}
	post(s.url, "/_test/gates/"+key, "", nil)
	wantProblem(t, <-first, 409, "idempotency-lease-lost")
	if c := counts(t, key, "http"); c != [2]int{2, 1} { // the frozen run's row went with its refused completion
		t.Fatalf("runs, rows = %v", c)
	}
	wantReplay(t, post(s.url, "/payments", key, book), taken)
}

func TestHTTPStaleCompletionIsRefused(t *testing.T) {
	s := httpServer(t, 0)
	key := newKey(t)
	first := make(chan reply, 1)
	go func() { first <- post(s.url, "/payments-unbeaten", key, book, "X-Test-Gate", key) }()
	poll(t, "the handler to start", func() bool { return counts(t, key, "http")[0] == 1 })
	poll(t, "its lease to end", func() bool {
		return queryBool(t, "SELECT expires_at < clock_timestamp() FROM idem_status($1, 'http')", key)
	})
	taken := post(s.url, "/payments-unbeaten", key, book)
	if taken.status != 201 {
		t.Fatalf("takeover: %d %s", taken.status, taken.body)
	}
	post(s.url, "/_test/gates/"+key, "", nil)
	stale := <-first
	wantProblem(t, stale, 409, "idempotency-lease-lost") // idem_complete with the old token: 55006
	if stale.header.Get("Location") != "" {
		t.Fatal("the refused response leaked the handler's headers")
	}
	if c := counts(t, key, "http"); c != [2]int{2, 1} {
		t.Fatalf("runs, rows = %v", c)
	}
}
