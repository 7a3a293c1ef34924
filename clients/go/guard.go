package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Store is the idempotency store behind a Guard (the Store interface of hand-written middlewares), in
// two-transaction mode: every call commits by itself, and the calls after the claim prove the lease
// with its fencing token. PGStore is the extension's; wrap it to add logging or metrics.
type Store interface {
	// Claim takes the key (outcome claimed, with a lease and a token) or says why not.
	Claim(ctx context.Context, key string, opts ClaimOptions) (Claim, error)
	// Heartbeat extends the lease; a *LeaseLostError when another consumer took the key over.
	Heartbeat(ctx context.Context, l Lease, ttl time.Duration) (time.Time, error)
	// Complete stores the response; a *LeaseLostError when the lease was lost.
	Complete(ctx context.Context, l Lease, payload json.RawMessage) error
	// Fail records a failure: "released" for another attempt, or "failed" (terminal).
	Fail(ctx context.Context, l Lease, errPayload json.RawMessage, retryable bool) (string, error)
}

// PGStore is the Store of the extension. DB is typically a *pgxpool.Pool: each call then runs in its
// own transaction on any connection, and the heartbeat goroutine never shares a connection with the
// handler. (A *pgx.Conn is not safe for concurrent use: do not give one to a Guard with heartbeats.)
type PGStore struct {
	DB Querier
}

// Claim calls idem_claim.
func (s PGStore) Claim(ctx context.Context, key string, opts ClaimOptions) (Claim, error) {
	return ClaimKey(ctx, s.DB, key, opts)
}

// Heartbeat calls idem_heartbeat with the lease's token.
func (s PGStore) Heartbeat(ctx context.Context, l Lease, ttl time.Duration) (time.Time, error) {
	return Heartbeat(ctx, s.DB, l, ttl)
}

// Complete calls idem_complete with the lease's token.
func (s PGStore) Complete(ctx context.Context, l Lease, payload json.RawMessage) error {
	return Complete(ctx, s.DB, l, payload)
}

// Fail calls idem_fail with the lease's token.
func (s PGStore) Fail(ctx context.Context, l Lease, errPayload json.RawMessage, retryable bool) (string, error) {
	return Fail(ctx, s.DB, l, errPayload, retryable)
}

// Handler is the business logic of two-transaction mode: side effects outside the database (an HTTP
// call, an e-mail). ctx is cancelled when the lease is lost (a heartbeat got 55006): stop then, the
// key is someone else's. Pass lease.Key on to a provider as its own idempotency key. Return the
// response to store (see ToPayload), or an error (Permanent for a terminal one).
type Handler func(ctx context.Context, lease Lease) (interface{}, error)

// Guard is the middleware of two-transaction mode: Do claims the key (committing a lease and a fencing
// token), runs the handler while a goroutine extends the lease, then records the result or the failure
// with the token.
type Guard struct {
	Store Store
	Scope string        // "" means DefaultScope
	TTL   time.Duration // lease length; 0 means 30 s
	// HeartbeatEvery is the pause between two heartbeats; 0 means TTL/3, a negative value turns
	// heartbeats off (the lease must then outlast the handler).
	HeartbeatEvery time.Duration
	// OnHeartbeatError, if set, hears of heartbeats that failed for another reason than a lost lease
	// (a connection error, say); the next heartbeat tries again. Set or not, the last such failure
	// (with no successful heartbeat after it) is kept, and is the HeartbeatErr of the *LeaseLostError
	// Do returns if the lease is lost (seen by a later heartbeat, idem_complete or idem_fail).
	OnHeartbeatError func(key string, err error)
}

func (g *Guard) ttl() time.Duration {
	if g.TTL > 0 {
		return g.TTL
	}
	return 30 * time.Second
}

// Do runs h at most once successfully per key, and returns its stored response:
//
//   - a duplicate of a completed key returns the stored response (Replayed) without running h;
//   - a key whose lease another consumer holds returns ErrInProgress (redeliver later); a terminal key
//     ErrFailed with the stored error (dead-letter it); a fingerprint mismatch ErrMismatch (*ClaimError);
//   - when h succeeds, its response is stored with the lease's token; a lease lost meanwhile returns a
//     *LeaseLostError (ErrLeaseLost): another consumer took the key over, so the outcome is theirs;
//   - when h fails, the failure is recorded (released for another attempt, or terminal for Permanent
//     errors and after idempotency.max_attempts) and a *HandlerError wrapping h's error is returned.
//
// Database errors are returned wrapped, never hidden.
func (g *Guard) Do(ctx context.Context, key string, h Handler) (Result, error) {
	return g.DoClaim(ctx, key, ClaimOptions{}, h)
}

// DoClaim is Do with idem_claim options (a fingerprint, say); empty fields take the Guard's.
func (g *Guard) DoClaim(ctx context.Context, key string, opts ClaimOptions, h Handler) (Result, error) {
	if opts.Scope == "" {
		opts.Scope = g.Scope
	}
	if opts.TTL == 0 {
		opts.TTL = g.ttl()
	}
	c, err := g.Store.Claim(ctx, key, opts)
	if err != nil {
		return Result{}, err
	}
	res := Result{Attempts: c.Attempts, Token: c.Token}
	switch c.Outcome {
	case Claimed:
	case Completed:
		res.Payload, res.Replayed = c.Payload, true
		return res, nil
	default:
		return res, c.Err()
	}
	lease := c.Lease()

	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	every := g.HeartbeatEvery
	if every == 0 {
		every = opts.TTL / 3
	}
	k := keepAlive(ctx, cancel, g.Store, lease, opts.TTL, every, g.OnHeartbeatError)
	out, herr := callHandler(hctx, lease, h)
	lostErr, lastHbErr := k.end()
	if lostErr != nil {
		return res, lostErr
	}

	if herr == nil {
		var payload json.RawMessage
		if payload, herr = ToPayload(out); herr == nil {
			if err := g.Store.Complete(ctx, lease, payload); err != nil {
				return res, withHeartbeatErr(err, lastHbErr, "idem_complete", lease)
			}
			res.Payload = payload
			return res, nil
		}
	}
	outcome, ferr := g.Store.Fail(ctx, lease, ErrorPayload(herr), !IsPermanent(herr))
	if ferr != nil {
		ferr = withHeartbeatErr(ferr, lastHbErr, "idem_fail", lease)
		return res, &HandlerError{Key: key, Scope: lease.Scope, Err: herr, RecordErr: ferr}
	}
	return res, &HandlerError{Key: key, Scope: lease.Scope, Err: herr, Outcome: outcome}
}

// keeper extends a lease with heartbeats in a goroutine of its own while a handler runs.
type keeper struct {
	mu      sync.Mutex
	lost    error         // a heartbeat found the lease lost
	hbErr   error         // the last heartbeat that failed otherwise, nil after a successful one
	stop    chan struct{} // the handler returned: no more heartbeats
	stopped chan struct{} // the heartbeat goroutine is gone
}

// keepAlive calls store.Heartbeat every `every` (none when every <= 0) until end, or until ctx ends. A
// heartbeat that finds the lease lost calls cancel (the handler's context: the key is someone else's now)
// and stops; other heartbeat errors go to onErr (when set) and the next beat tries again.
func keepAlive(ctx context.Context, cancel context.CancelFunc, store Store, lease Lease, ttl, every time.Duration,
	onErr func(key string, err error)) *keeper {
	k := &keeper{stop: make(chan struct{}), stopped: make(chan struct{})}
	if every <= 0 {
		close(k.stopped)
		return k
	}
	go func() {
		defer close(k.stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// ctx, not the handler's context: a heartbeat in flight when the handler returns is let
			// finish (cancelling a query makes pgx close its connection)
			_, err := store.Heartbeat(ctx, lease, ttl)
			switch {
			case err == nil:
				k.mu.Lock()
				k.hbErr = nil
				k.mu.Unlock()
			case errors.Is(err, ErrLeaseLost):
				k.mu.Lock()
				k.lost = withHeartbeatErr(err, k.hbErr, "idem_heartbeat", lease)
				k.mu.Unlock()
				cancel()
				return
			case ctx.Err() != nil:
				return
			default:
				k.mu.Lock()
				k.hbErr = err
				k.mu.Unlock()
				if onErr != nil {
					onErr(lease.Key, err)
				}
			}
		}
	}()
	return k
}

// end stops the heartbeats, waits for the goroutine, and returns the lease loss a heartbeat found (nil
// when none) and the last heartbeat error with no successful heartbeat after it.
func (k *keeper) end() (lost, lastHbErr error) {
	close(k.stop)
	<-k.stopped
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lost, k.hbErr
}

func callHandler(ctx context.Context, l Lease, h Handler) (out interface{}, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("idem: handler panicked: %v", p)
		}
	}()
	return h(ctx, l)
}

// Middleware wraps a message handler with a Guard: key extracts the idempotency key of a message (a
// header, or Key over its identifying fields). The wrapped handler returns nil when the message was
// processed now or before (a replay), and Do's error otherwise: ErrInProgress (redeliver later),
// ErrFailed (dead-letter), ErrLeaseLost, a *HandlerError, or a database error.
func Middleware[M any](g *Guard, key func(M) string, next func(ctx context.Context, msg M) (interface{}, error)) func(ctx context.Context, msg M) error {
	return func(ctx context.Context, msg M) error {
		_, err := g.Do(ctx, key(msg), func(ctx context.Context, _ Lease) (interface{}, error) {
			return next(ctx, msg)
		})
		return err
	}
}
