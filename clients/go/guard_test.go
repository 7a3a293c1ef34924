package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgconn"

	"idempotency/clients/go/idem"
)

// Two goroutines race one key through the Guard (two-transaction mode): the handler runs once; the
// loser gets ErrInProgress while the winner's lease is live, and a later delivery gets the replay.
func TestGuardRaceOneKey(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	g := &idem.Guard{Store: idem.PGStore{DB: pool}, Scope: "go-guard", TTL: 5 * time.Second}
	var runs int32
	var wg sync.WaitGroup
	errs := make([]error, 2)
	results := make([]idem.Result, 2)
	start := make(chan struct{})
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			results[i], errs[i] = g.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
				atomic.AddInt32(&runs, 1)
				time.Sleep(300 * time.Millisecond)
				return map[string]string{"sent": l.Key}, nil
			})
		}(i)
	}
	close(start)
	wg.Wait()
	if runs != 1 {
		t.Fatalf("handler ran %d times, want 1", runs)
	}
	won, lost := 0, 0
	for i := range errs {
		switch {
		case errs[i] == nil && !results[i].Replayed:
			won++
		case errors.Is(errs[i], idem.ErrInProgress):
			lost++
		default:
			t.Fatalf("caller %d: %+v %v", i, results[i], errs[i])
		}
	}
	if won != 1 || lost != 1 {
		t.Fatalf("won %d, in progress %d", won, lost)
	}
	res, err := g.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
		t.Error("handler ran for a duplicate")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Payload) != fmt.Sprintf(`{"sent": %q}`, key) {
		t.Fatalf("replay: %+v (%s) %v", res, res.Payload, err)
	}
}

// Heartbeats keep a short lease alive through a handler that runs several times its length: nobody
// else can claim the key meanwhile, and the completion with the token succeeds.
func TestGuardHeartbeatsKeepLease(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	g := &idem.Guard{Store: idem.PGStore{DB: pool}, TTL: 400 * time.Millisecond, HeartbeatEvery: 100 * time.Millisecond,
		OnHeartbeatError: func(key string, err error) { t.Errorf("heartbeat: %v", err) }}
	stolen := int32(0)
	res, err := g.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			c, err := idem.ClaimKey(ctx, pool, key, idem.ClaimOptions{TTL: time.Second})
			if err != nil {
				return nil, err
			}
			if c.Outcome != idem.InProgress {
				atomic.StoreInt32(&stolen, 1)
			}
			time.Sleep(150 * time.Millisecond)
		}
		return "done", ctx.Err()
	})
	if err != nil || stolen != 0 {
		t.Fatalf("err %v, stolen %d", err, stolen)
	}
	if st, attempts := status(t, key, "default"); st != "completed" || attempts != 1 {
		t.Fatalf("status %s attempts %d; result %+v", st, attempts, res)
	}
}

// Lease loss with a short ttl and no heartbeats: another consumer takes the expired lease over and
// completes; the stalled holder's completion is refused with ErrLeaseLost (a *LeaseLostError around
// the driver's 55006), which is no serialization failure.
func TestGuardLeaseLostOnComplete(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	slow := &idem.Guard{Store: idem.PGStore{DB: pool}, TTL: 200 * time.Millisecond, HeartbeatEvery: -1}
	fast := &idem.Guard{Store: idem.PGStore{DB: pool}, TTL: 5 * time.Second}
	var slowRes idem.Result
	_, err := slow.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
		time.Sleep(400 * time.Millisecond) // the lease expires
		r, err := fast.Do(ctx, key, func(ctx context.Context, l2 idem.Lease) (interface{}, error) {
			if l2.Token <= l.Token {
				return nil, fmt.Errorf("takeover token %d not above %d", l2.Token, l.Token)
			}
			return "taken over", nil
		})
		if err != nil || r.Replayed {
			return nil, fmt.Errorf("takeover: %+v %v", r, err)
		}
		slowRes = r
		return "stale", nil
	})
	var lle *idem.LeaseLostError
	if !errors.Is(err, idem.ErrLeaseLost) || !errors.As(err, &lle) || lle.Op != "idem_complete" {
		t.Fatalf("want ErrLeaseLost from idem_complete, got %v (takeover %+v)", err, slowRes)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55006" || idem.IsRetryable(err) {
		t.Fatalf("want the driver's 55006 inside, not retryable: %v", err)
	}
	res, err := fast.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) { return nil, nil })
	if err != nil || !res.Replayed || string(res.Payload) != `"taken over"` {
		t.Fatalf("the new holder's result is not the stored one: %+v %v", res, err)
	}
}

// Lease loss seen by a heartbeat: the handler's context is cancelled as soon as a heartbeat meets the
// new holder's token, and Do returns ErrLeaseLost from idem_heartbeat.
func TestGuardLeaseLostOnHeartbeat(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	// heartbeats come too late for the lease: it expires at 200 ms, the first heartbeat is at 500 ms
	slow := &idem.Guard{Store: idem.PGStore{DB: pool}, TTL: 200 * time.Millisecond, HeartbeatEvery: 500 * time.Millisecond}
	begun := time.Now()
	var cancelledAfter time.Duration
	_, err := slow.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
		time.Sleep(300 * time.Millisecond)
		c, err := idem.ClaimKey(ctx, pool, key, idem.ClaimOptions{TTL: 10 * time.Second}) // the takeover
		if err != nil || c.Outcome != idem.Claimed {
			return nil, fmt.Errorf("takeover: %+v %v", c, err)
		}
		select {
		case <-ctx.Done():
			cancelledAfter = time.Since(begun)
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
			return "never cancelled", nil
		}
	})
	var lle *idem.LeaseLostError
	if !errors.As(err, &lle) || lle.Op != "idem_heartbeat" || lle.HeartbeatErr != nil {
		t.Fatalf("want ErrLeaseLost from idem_heartbeat (no heartbeat failed before), got %v", err)
	}
	if cancelledAfter == 0 || cancelledAfter > 2*time.Second {
		t.Fatalf("the handler's context was cancelled after %v", cancelledAfter)
	}
}

// connDown is what a heartbeat of flakyStore returns while broken: a real database error (22012) inside
// an error type of its own, as a driver's network error would be.
type connDown struct{ err error }

func (c *connDown) Error() string { return "connection down: " + c.err.Error() }
func (c *connDown) Unwrap() error { return c.err }

// flakyStore is the extension's store whose heartbeats fail while broken is set.
type flakyStore struct {
	idem.PGStore
	broken   atomic.Bool
	failures int32
}

func (s *flakyStore) Heartbeat(ctx context.Context, l idem.Lease, ttl time.Duration) (time.Time, error) {
	if s.broken.Load() {
		atomic.AddInt32(&s.failures, 1)
		_, err := pool.Exec(ctx, "SELECT 1/0")
		return time.Time{}, &connDown{err}
	}
	return s.PGStore.Heartbeat(ctx, l, ttl)
}

// Heartbeats that fail (with no OnHeartbeatError to hear of it) let the lease run out; another consumer
// takes the key over; the lease loss that follows, seen by a later heartbeat or by idem_complete,
// carries the last heartbeat failure: errors.As finds the heartbeat's error type and its 22012, while
// the *pgconn.PgError found first is still the 55006 of the loss.
func TestGuardLeaseLostCarriesHeartbeatError(t *testing.T) {
	for _, op := range []string{"idem_heartbeat", "idem_complete"} {
		t.Run(op, func(t *testing.T) {
			ctx := context.Background()
			key := newKey(t)
			store := &flakyStore{PGStore: idem.PGStore{DB: pool}}
			g := &idem.Guard{Store: store, TTL: 200 * time.Millisecond, HeartbeatEvery: 60 * time.Millisecond}
			_, err := g.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
				store.broken.Store(true)
				time.Sleep(300 * time.Millisecond)                                                // the lease runs out: no heartbeat gets through
				c, err := idem.ClaimKey(ctx, pool, key, idem.ClaimOptions{TTL: 10 * time.Second}) // the takeover
				if err != nil || c.Outcome != idem.Claimed {
					return nil, fmt.Errorf("takeover: %+v %v", c, err)
				}
				if op == "idem_complete" {
					time.Sleep(100 * time.Millisecond) // heartbeats still failing; completion finds the loss
					return "stale", nil
				}
				store.broken.Store(false) // the next heartbeat gets through, and finds the new token
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(5 * time.Second):
					return "never cancelled", nil
				}
			})
			var lle *idem.LeaseLostError
			if !errors.Is(err, idem.ErrLeaseLost) || !errors.As(err, &lle) || lle.Op != op {
				t.Fatalf("want ErrLeaseLost from %s, got %v", op, err)
			}
			var cd *connDown
			if lle.HeartbeatErr == nil || !errors.As(err, &cd) || idem.SQLState(cd) != "22012" ||
				!strings.Contains(err.Error(), "after a failed heartbeat: connection down") {
				t.Fatalf("the heartbeat's failure is not carried by the lease loss: %v (heartbeat failures: %d)",
					err, atomic.LoadInt32(&store.failures))
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "55006" || idem.SQLState(err) != "55006" {
				t.Fatalf("the first database error inside must be the 55006: %v", err)
			}
		})
	}
}

// Failures through the Guard: a retryable one releases the key (the next delivery runs again), a
// Permanent one makes it terminal (ErrFailed, then ErrFailed from the claim).
func TestGuardFailures(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	g := &idem.Guard{Store: idem.PGStore{DB: pool}, Scope: "go-guard-fail", TTL: 5 * time.Second}
	smtp := errors.New("SMTP 451, try again")
	_, err := g.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) { return nil, smtp })
	var he *idem.HandlerError
	if !errors.Is(err, smtp) || !errors.As(err, &he) || he.Outcome != "released" || errors.Is(err, idem.ErrFailed) {
		t.Fatalf("want a released failure wrapping the handler's error, got %v", err)
	}
	_, err = g.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
		return nil, idem.Permanent(errors.New("mailbox does not exist"))
	})
	if !errors.Is(err, idem.ErrFailed) {
		t.Fatalf("want a terminal failure, got %v", err)
	}
	_, err = g.Do(ctx, key, func(ctx context.Context, l idem.Lease) (interface{}, error) {
		t.Error("ran for a terminal key")
		return nil, nil
	})
	var ce *idem.ClaimError
	if !errors.As(err, &ce) || ce.Claim.Outcome != idem.Failed || ce.Claim.Attempts != 2 {
		t.Fatalf("want ErrFailed from the claim after 2 attempts, got %v", err)
	}
}

// Middleware: the generic wrapper of a message handler.
func TestMiddleware(t *testing.T) {
	type msg struct{ ID, Body string }
	g := &idem.Guard{Store: idem.PGStore{DB: pool}, Scope: "go-mw", TTL: 5 * time.Second}
	var handled []string
	h := idem.Middleware(g, func(m msg) string { return m.ID }, func(ctx context.Context, m msg) (interface{}, error) {
		handled = append(handled, m.Body)
		return nil, nil
	})
	id := newKey(t)
	for _, m := range []msg{{id, "a"}, {id, "a again"}, {id + "-2", "b"}} {
		if err := h(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(handled) != "[a b]" {
		t.Fatalf("handled %v", handled)
	}
}
