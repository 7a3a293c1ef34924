package idem_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"
)

// The tests run against a real PostgreSQL with the extension: IDEM_TEST_DSN names a database where
// CREATE EXTENSION idempotency was run (clients/go/test starts a throwaway cluster and sets it).
var pool *pgxpool.Pool

func TestMain(m *testing.M) {
	if addr := os.Getenv("IDEM_HTTP_SERVE"); addr != "" { // the HTTP tests' server (httpapp_test.go)
		os.Exit(serveTestApp(addr))
	}
	dsn := os.Getenv("IDEM_TEST_DSN")
	if dsn == "" {
		fmt.Fprintln(os.Stderr, "IDEM_TEST_DSN is not set: run clients/go/test, which starts a cluster with the extension")
		os.Exit(2)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "IDEM_TEST_DSN:", err)
		os.Exit(2)
	}
	cfg.MaxConns = 12
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	pool, err = pgxpool.ConnectConfig(ctx, cfg)
	cancel()
	if err == nil {
		err = pool.Ping(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot connect to IDEM_TEST_DSN:", err)
		os.Exit(2)
	}
	_, err = pool.Exec(context.Background(),
		`CREATE TABLE IF NOT EXISTS ledger (key text NOT NULL, note text, at timestamptz DEFAULT clock_timestamp())`)
	if err == nil {
		_, err = pool.Exec(context.Background(), httpTables)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
		os.Exit(2)
	}
	code := m.Run()
	stopHTTPServers()
	pool.Close()
	os.Exit(code)
}

var seq int64

// newKey is a key no other test (nor an earlier run against the same database) uses.
func newKey(t *testing.T) string {
	return fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano(), atomic.AddInt64(&seq, 1))
}

func ledgerRows(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func status(t *testing.T, key, scope string) (st string, attempts int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT status, attempts FROM idem_status($1, $2)`, key, scope).Scan(&st, &attempts)
	if err != nil {
		t.Fatalf("idem_status(%q): %v", key, err)
	}
	return st, attempts
}
