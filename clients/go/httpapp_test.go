package idem_test

// The HTTP server of http_test.go: this test binary run again with IDEM_HTTP_SERVE=host:port (TestMain),
// in a process of its own that the tests kill -9, freeze and restart. Routes: POST /orders (key
// required, one transaction), POST /payments (key required, two transactions, lease IDEM_HTTP_LEASE),
// POST /notes (key optional), POST /payments-unbeaten (two transactions, a lease of 1 s without
// heartbeats, through a second middleware), POST /_test/gates/NAME (opens a gate), GET /_test/health. The handler
// records each run in http_runs through the pool (so that a run rolled back or killed still counts),
// writes its business row in http_orders through the request's transaction, and obeys X-Test-Fail
// (raise: a panic, which the app's recoverer answers with 500; 500), X-Test-Gate (waits until the gate is
// opened) and X-Test-Block (waits until the client goes: the test kills the server). The scope is the
// X-Tenant header when given.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"

	"idempotency/clients/go/idem"
)

const httpTables = `
CREATE TABLE IF NOT EXISTS http_orders (id serial PRIMARY KEY, idem_key text, scope text, item text);
CREATE TABLE IF NOT EXISTS http_runs (id serial PRIMARY KEY, idem_key text, scope text, mode text, token bigint,
                                      server_pid int, backend_pid int, started_at timestamptz DEFAULT clock_timestamp())`

var (
	gatesMu sync.Mutex
	gates   = map[string]chan struct{}{}
)

func gate(name string) chan struct{} {
	gatesMu.Lock()
	defer gatesMu.Unlock()
	if gates[name] == nil {
		gates[name] = make(chan struct{})
	}
	return gates[name]
}

// recoverer is the app's outermost middleware, as most apps have one: a panic becomes a 500.
func recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				http.Error(w, fmt.Sprint("panic: ", p), http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func serveTestApp(addr string) int {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("IDEM_TEST_DSN") + " application_name=" + os.Getenv("IDEM_HTTP_APP_NAME"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.ConnectConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lease, _ := time.ParseDuration(os.Getenv("IDEM_HTTP_LEASE"))
	mw := &idem.HTTP{
		DB: pool,
		Routes: []idem.Route{{Method: "POST", Pattern: "/orders", Require: true},
			{Method: "POST", Pattern: "/payments", Require: true, Mode: idem.TwoTransactions},
			{Method: "POST", Pattern: "/notes"}},
		Lease:        lease,
		Scope:        func(r *http.Request) string { return r.Header.Get("X-Tenant") },
		MaxBodyBytes: 1024,
	}
	order := func(w http.ResponseWriter, r *http.Request) {
		info := idem.FromRequest(r)
		ctx := r.Context()
		var body struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var backend, id int
		var token interface{}
		if info.Token != 0 {
			token = info.Token
		}
		if err := info.Tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
			panic(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO http_runs (idem_key, scope, mode, token, server_pid, backend_pid)
		                              VALUES ($1, $2, $3, $4, $5, $6)`, info.Key, info.Scope, string(info.Mode), token,
			os.Getpid(), backend); err != nil {
			panic(err)
		}
		err := info.Tx.QueryRow(ctx, "INSERT INTO http_orders (idem_key, scope, item) VALUES ($1, $2, $3) RETURNING id",
			info.Key, info.Scope, body.Item).Scan(&id)
		if err != nil {
			panic(err)
		}
		if g := r.Header.Get("X-Test-Gate"); g != "" {
			<-gate(g)
		}
		if r.Header.Get("X-Test-Block") != "" {
			<-ctx.Done()
			return
		}
		switch r.Header.Get("X-Test-Fail") {
		case "raise":
			panic("the handler failed")
		case "500":
			http.Error(w, "failed on purpose", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.Header().Set("X-Custom", "first-run-only")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]interface{}{"id": id, "item": body.Item})
	}
	mux := http.NewServeMux()
	for _, p := range []string{"/orders", "/payments", "/notes"} {
		mux.HandleFunc(p, order)
	}
	// a lease of 1 s without heartbeats: the completion is what finds a takeover
	unbeaten := &idem.HTTP{DB: pool, Routes: []idem.Route{{Method: "POST", Pattern: "/**", Require: true}},
		Mode: idem.TwoTransactions, Lease: time.Second, HeartbeatEvery: -1}
	mux.Handle("/payments-unbeaten", unbeaten.Middleware(http.HandlerFunc(order)))
	mux.HandleFunc("/_test/gates/", func(w http.ResponseWriter, r *http.Request) {
		g := gate(strings.TrimPrefix(r.URL.Path, "/_test/gates/"))
		gatesMu.Lock()
		select {
		case <-g:
		default:
			close(g)
		}
		gatesMu.Unlock()
	})
	mux.HandleFunc("/_test/health", func(w http.ResponseWriter, r *http.Request) {})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Fprintln(os.Stderr, (&http.Server{Handler: recoverer(mw.Middleware(mux))}).Serve(ln))
	return 1
}
