package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v4"
)

// TxHandler is the business logic of one-transaction mode: it writes through tx (a savepoint inside the
// caller's transaction) and returns the response to store (see ToPayload). It must not commit or roll
// back tx. Return Permanent(err) for a failure no retry can cure.
type TxHandler func(ctx context.Context, tx pgx.Tx) (interface{}, error)

// InTx runs h for key inside the caller's transaction tx (one-transaction mode):
//
//   - idem_claim; a duplicate (completed) returns the stored response with Replayed set, without
//     running h; in_progress, failed and mismatch return a *ClaimError;
//   - claimed: h runs inside a savepoint; on success the response is stored with idem_complete;
//   - on h's error the savepoint is rolled back (h's writes vanish) and the failure is recorded with
//     idem_fail (terminal for Permanent errors); a *HandlerError is returned. Commit tx so that the
//     failure is recorded;
//   - a serialization failure or deadlock (IsRetryable) from h is returned as is: roll tx back and run
//     the whole transaction again (RetryTx, or Wrapper, does).
//
// The caller commits tx: the business writes, the stored response (and, say, a broker offset recorded
// in the same transaction) become visible together, or not at all.
func InTx(ctx context.Context, tx pgx.Tx, key string, opts ClaimOptions, h TxHandler) (res Result, err error) {
	c, err := ClaimKey(ctx, tx, key, opts)
	if err != nil {
		return res, err
	}
	res = Result{Attempts: c.Attempts, Token: c.Token}
	switch c.Outcome {
	case Claimed:
	case Completed:
		res.Payload, res.Replayed = c.Payload, true
		return res, nil
	default:
		return res, c.Err()
	}
	lease := Lease{Key: key, Scope: c.Scope} // token NULL: claimed by this transaction

	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		return res, fmt.Errorf("idem: savepoint: %w", err)
	}
	out, herr := callTxHandler(ctx, sp, h)
	if herr == nil {
		var payload json.RawMessage
		if payload, herr = ToPayload(out); herr == nil {
			if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
				return res, fmt.Errorf("idem: release savepoint: %w", err)
			}
			if err := Complete(ctx, tx, lease, payload); err != nil {
				return res, err
			}
			res.Payload = payload
			return res, nil
		}
	}
	if IsRetryable(herr) {
		_ = sp.Rollback(ctx)
		return res, herr
	}
	if err := sp.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) { // ROLLBACK TO SAVEPOINT
		return res, &HandlerError{Key: key, Scope: c.Scope, Err: herr,
			RecordErr: fmt.Errorf("idem: rollback to savepoint: %w", err)}
	}
	outcome, ferr := Fail(ctx, tx, lease, ErrorPayload(herr), !IsPermanent(herr))
	if ferr != nil {
		if IsRetryable(ferr) {
			return res, ferr
		}
		return res, &HandlerError{Key: key, Scope: c.Scope, Err: herr, RecordErr: ferr}
	}
	return res, &HandlerError{Key: key, Scope: c.Scope, Err: herr, Outcome: outcome}
}

// callTxHandler runs h, turning a panic into an error: the failure is then recorded like any other
// (retryable) and reported as a *HandlerError whose Err says what the panic was.
func callTxHandler(ctx context.Context, tx pgx.Tx, h TxHandler) (out interface{}, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("idem: handler panicked: %v", p)
		}
	}()
	return h(ctx, tx)
}

// ErrorPayload is what a failure is recorded as: {"error": err.Error()}.
func ErrorPayload(err error) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"error": err.Error()})
	return b
}

// Wrapper runs handlers in transactions of their own, in one-transaction mode (the IdempotencyWrapper
// shape): each Run begins a transaction on DB, runs InTx, and commits; serialization failures and
// deadlocks run the whole transaction again (RetryTx).
type Wrapper struct {
	DB          TxBeginner    // a *pgxpool.Pool or a *pgx.Conn (one Run at a time on a Conn)
	Scope       string        // "" means DefaultScope
	TxOptions   pgx.TxOptions // isolation level etc.
	MaxAttempts int           // for 40001 / 40P01; 0 means 5
}

// Run runs h exactly once per key over all committed transactions, and returns its stored response.
// A duplicate gets the stored response (Replayed) without running h. Errors: *ClaimError
// (ErrInProgress, ErrFailed, ErrMismatch), *HandlerError (h failed; the failure is committed), the
// database's errors wrapped (the last 40001/40P01 after MaxAttempts).
func (w *Wrapper) Run(ctx context.Context, key string, h TxHandler) (Result, error) {
	return w.RunClaim(ctx, key, ClaimOptions{}, h)
}

// RunClaim is Run with idem_claim options (fingerprint, ttl, no-wait); an empty opts.Scope means the
// Wrapper's.
func (w *Wrapper) RunClaim(ctx context.Context, key string, opts ClaimOptions, h TxHandler) (Result, error) {
	if opts.Scope == "" {
		opts.Scope = w.Scope
	}
	var res Result
	var outcomeErr error // an answer to commit with (a recorded failure, a claim that was refused)
	err := RetryTx(ctx, w.DB, w.TxOptions, w.MaxAttempts, func(tx pgx.Tx) error {
		var err error
		res, err = InTx(ctx, tx, key, opts, h)
		outcomeErr = nil
		var he *HandlerError
		var ce *ClaimError
		if errors.As(err, &he) && he.RecordErr == nil || errors.As(err, &ce) {
			outcomeErr = err
			return nil // commit: the recorded failure must persist
		}
		return err
	})
	if err != nil {
		return res, err
	}
	return res, outcomeErr
}
