package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"

	"idempotency/clients/go/idem"
)

func insertLedger(ctx context.Context, tx pgx.Tx, key, note string) error {
	_, err := tx.Exec(ctx, `INSERT INTO ledger (key, note) VALUES ($1, $2)`, key, note)
	return err
}

// Eight goroutines race one key through Wrapper.Run: the handler runs once, its write commits once, and
// every other caller gets the stored response replayed.
func TestWrapperRaceOneKey(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	w := &idem.Wrapper{DB: pool, Scope: "go-wrapper"}
	var runs int32
	const n = 8
	results := make([]idem.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			results[i], errs[i] = w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
				atomic.AddInt32(&runs, 1)
				time.Sleep(100 * time.Millisecond) // the others wait on the key meanwhile
				if err := insertLedger(ctx, tx, key, "charged"); err != nil {
					return nil, err
				}
				return map[string]interface{}{"ledger": "charged", "worker": i}, nil
			})
		}(i)
	}
	close(start)
	wg.Wait()
	if runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
	fresh := 0
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !results[i].Replayed {
			fresh++
		}
		var got map[string]interface{}
		if err := json.Unmarshal(results[i].Payload, &got); err != nil || got["ledger"] != "charged" {
			t.Fatalf("caller %d: payload %s", i, results[i].Payload)
		}
	}
	if fresh != 1 {
		t.Fatalf("%d callers ran the handler, want 1", fresh)
	}
	if got := ledgerRows(t, key); got != 1 {
		t.Fatalf("ledger has %d rows for the key, want 1", got)
	}
	if st, _ := status(t, key, "go-wrapper"); st != "completed" {
		t.Fatalf("status %s, want completed", st)
	}
}

// A duplicate gets the stored response without running the handler.
func TestWrapperReplay(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	w := &idem.Wrapper{DB: pool}
	r1, err := w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		return json.RawMessage(`{"receipt": 7}`), insertLedger(ctx, tx, key, "first")
	})
	if err != nil || r1.Replayed {
		t.Fatalf("first run: %+v %v", r1, err)
	}
	r2, err := w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		t.Error("the handler ran for a duplicate")
		return nil, nil
	})
	if err != nil || !r2.Replayed {
		t.Fatalf("second run: %+v %v", r2, err)
	}
	var got map[string]int
	if err := json.Unmarshal(r2.Payload, &got); err != nil || got["receipt"] != 7 {
		t.Fatalf("replayed payload %s (%v)", r2.Payload, err)
	}
	if n := ledgerRows(t, key); n != 1 {
		t.Fatalf("ledger rows %d, want 1", n)
	}
}

// A Permanent failure: the handler's write is rolled back to the savepoint, the failure is committed
// as terminal, and the next delivery gets ErrFailed with the stored error, without running the handler.
func TestWrapperTerminalFailure(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	w := &idem.Wrapper{DB: pool, Scope: "go-fail"}
	_, err := w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		if err := insertLedger(ctx, tx, key, "must vanish"); err != nil {
			return nil, err
		}
		return nil, idem.Permanent(errors.New("card declined"))
	})
	var he *idem.HandlerError
	if !errors.As(err, &he) || he.Outcome != "failed" || !he.Terminal() {
		t.Fatalf("want a terminal *HandlerError, got %#v", err)
	}
	if !errors.Is(err, idem.ErrFailed) || errors.Is(err, idem.ErrLeaseLost) || idem.IsRetryable(err) {
		t.Fatalf("error classification wrong: %v", err)
	}
	if !idem.IsPermanent(err) || !strings.Contains(err.Error(), "card declined") {
		t.Fatalf("the handler's error is not reachable: %v", err)
	}
	if n := ledgerRows(t, key); n != 0 {
		t.Fatalf("the failed handler's write survived: %d rows", n)
	}
	if st, _ := status(t, key, "go-fail"); st != "failed" {
		t.Fatalf("status %s, want failed", st)
	}
	_, err = w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		t.Error("the handler ran for a terminal key")
		return nil, nil
	})
	var ce *idem.ClaimError
	if !errors.Is(err, idem.ErrFailed) || !errors.As(err, &ce) || ce.Claim.Outcome != idem.Failed {
		t.Fatalf("want ErrFailed from the claim, got %v", err)
	}
	if !strings.Contains(string(ce.Claim.Payload), "card declined") {
		t.Fatalf("stored error %s", ce.Claim.Payload)
	}
}

// A retryable failure releases the key: the next delivery runs the handler again (attempt 2), and a
// SQL error inside the handler is rolled back to the savepoint without aborting the transaction.
func TestWrapperRetryableFailure(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	w := &idem.Wrapper{DB: pool}
	_, err := w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		_, err := tx.Exec(ctx, `SELECT 1/0`)
		return nil, err
	})
	var he *idem.HandlerError
	if !errors.As(err, &he) || he.Outcome != "released" || errors.Is(err, idem.ErrFailed) {
		t.Fatalf("want a released *HandlerError, got %v", err)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22012" {
		t.Fatalf("the handler's database error is hidden: %v", err)
	}
	res, err := w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		return "ok", insertLedger(ctx, tx, key, "second attempt")
	})
	if err != nil || res.Replayed || res.Attempts != 2 || string(res.Payload) != `"ok"` {
		t.Fatalf("second attempt: %+v %v", res, err)
	}
}

// InTx inside the caller's REPEATABLE READ transaction: a key completed by another transaction after
// the snapshot raises 40001, which IsRetryable recognizes (and is no lease loss); RetryTx runs the
// transaction again, which then sees the key completed.
func TestSerializationFailureRetried(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	attempts := 0
	var final idem.Result
	var firstErr error
	err := idem.RetryTx(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, 3, func(tx pgx.Tx) error {
		attempts++
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot
			return err
		}
		if attempts == 1 {
			w := &idem.Wrapper{DB: pool}
			if _, err := w.Run(ctx, key, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
				return "by the other", nil
			}); err != nil {
				return err
			}
		}
		res, err := idem.InTx(ctx, tx, key, idem.ClaimOptions{}, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
			return "by me", nil
		})
		if attempts == 1 {
			firstErr = err
		}
		final = res
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 2 {
		t.Fatalf("attempts %d, want 2", attempts)
	}
	if idem.SQLState(firstErr) != "40001" || !idem.IsRetryable(firstErr) || errors.Is(firstErr, idem.ErrLeaseLost) {
		t.Fatalf("first attempt: want a retryable 40001, got %v", firstErr)
	}
	if !final.Replayed || string(final.Payload) != `"by the other"` {
		t.Fatalf("after the retry: %+v", final)
	}
}

// Database errors reach the caller with their SQLSTATE.
func TestDatabaseErrorsNotHidden(t *testing.T) {
	ctx := context.Background()
	err := idem.Complete(ctx, pool, idem.Lease{Key: newKey(t), Token: 1}, nil)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "P0002" {
		t.Fatalf("want P0002 from idem_complete of a missing key, got %v", err)
	}
	_, err = idem.ClaimKey(ctx, pool, "", idem.ClaimOptions{})
	if idem.SQLState(err) != "22023" {
		t.Fatalf("want 22023 for an empty key, got %v", err)
	}
	_, err = idem.ClaimKey(ctx, pool, newKey(t), idem.ClaimOptions{TTL: -time.Second})
	if idem.SQLState(err) != "22023" {
		t.Fatalf("want 22023 for a negative ttl, got %v", err)
	}
}

// A fingerprint mismatch is ErrMismatch.
func TestMismatch(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	w := &idem.Wrapper{DB: pool}
	fp1, _ := idem.Fingerprint([]byte(`{"amount": 10}`))
	fp2, _ := idem.Fingerprint([]byte(`{"amount": 11}`))
	if _, err := w.RunClaim(ctx, key, idem.ClaimOptions{Fingerprint: fp1}, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := w.RunClaim(ctx, key, idem.ClaimOptions{Fingerprint: fp2}, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		t.Error("ran with a different fingerprint")
		return nil, nil
	})
	if !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("want ErrMismatch, got %v", err)
	}
	res, err := w.RunClaim(ctx, key, idem.ClaimOptions{Fingerprint: fp1}, func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		t.Error("ran for a duplicate")
		return nil, nil
	})
	if err != nil || !res.Replayed {
		t.Fatalf("same fingerprint: %+v %v", res, err)
	}
}
