package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

// Sentinels for errors.Is. The concrete errors carry the details (errors.As).
var (
	// ErrLeaseLost: the lease was taken over (or released) and the fencing token is no longer the key's
	// (SQLSTATE 55006). The work done under it must not be reported as done. Not retryable as such: the
	// message is redelivered and the new holder decides. Concrete type: *LeaseLostError.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrInProgress: another consumer holds a live lease on the key (or, with NoWait, an open
	// transaction holds it). Redeliver later. Concrete type: *ClaimError.
	ErrInProgress = errors.New("idem: key in progress elsewhere")
	// ErrFailed: the key failed terminally (a permanent failure, or too many attempts): route the message
	// to a dead-letter queue. Concrete types: *ClaimError (the claim said failed; Payload is the stored
	// error) or *HandlerError (this run's failure made the key terminal).
	ErrFailed = errors.New("idem: key failed terminally")
	// ErrMismatch: the key exists with a different request fingerprint. Concrete type: *ClaimError.
	ErrMismatch = errors.New("idem: key exists with a different fingerprint")
)

// ClaimError is a claim that did not give the key to the caller: in_progress, failed or mismatch.
// errors.Is matches ErrInProgress, ErrFailed or ErrMismatch after the outcome.
type ClaimError struct {
	Claim Claim
}

func (e *ClaimError) Error() string {
	msg := fmt.Sprintf("idem: key %q (scope %q) is %s after %d attempts", e.Claim.Key, e.Claim.Scope,
		e.Claim.Outcome, e.Claim.Attempts)
	if len(e.Claim.Payload) > 0 {
		msg += ": " + string(e.Claim.Payload)
	}
	return msg
}

// Is matches the sentinel of the outcome.
func (e *ClaimError) Is(target error) bool {
	switch e.Claim.Outcome {
	case InProgress:
		return target == ErrInProgress
	case Failed:
		return target == ErrFailed
	case Mismatch:
		return target == ErrMismatch
	}
	return false
}

// LeaseLostError is SQLSTATE 55006 from idem_complete, idem_fail or idem_heartbeat. Unwrap gives the
// driver's error (a *pgconn.PgError inside).
//
// HeartbeatErr is, when a Guard lost its lease, the last heartbeat that failed for another reason (a
// connection error, a timeout) with no successful heartbeat after it: often why the lease ran out.
// errors.Is and errors.As look into it too, after Err: errors.As(err, &pgErr) still gives the 55006
// first, and a heartbeat's error of another type (a *net.OpError, say) is found in HeartbeatErr.
type LeaseLostError struct {
	Op           string // idem_complete, idem_fail or idem_heartbeat
	Key          string
	Scope        string
	Token        int64
	Err          error
	HeartbeatErr error
}

func (e *LeaseLostError) Error() string {
	msg := fmt.Sprintf("idem: lease lost: %s(%q, scope %q, token %d): %v", e.Op, e.Key, e.Scope, e.Token, e.Err)
	if e.HeartbeatErr != nil {
		msg += fmt.Sprintf(" (after a failed heartbeat: %v)", e.HeartbeatErr)
	}
	return msg
}

// Is matches ErrLeaseLost, and what HeartbeatErr matches.
func (e *LeaseLostError) Is(target error) bool {
	return target == ErrLeaseLost || e.HeartbeatErr != nil && errors.Is(e.HeartbeatErr, target)
}

// As looks into Err, then into HeartbeatErr.
func (e *LeaseLostError) As(target interface{}) bool {
	if e.Err != nil && errors.As(e.Err, target) {
		return true
	}
	return e.HeartbeatErr != nil && errors.As(e.HeartbeatErr, target)
}

// Unwrap gives the driver's error.
func (e *LeaseLostError) Unwrap() error { return e.Err }

// withHeartbeatErr gives err with hb as the HeartbeatErr of its lease loss: a copy of a *LeaseLostError,
// or a *LeaseLostError around another error that matches ErrLeaseLost (a Store of one's own may return
// ErrLeaseLost itself); any other error as is.
func withHeartbeatErr(err, hb error, op string, l Lease) error {
	if hb == nil || err == nil {
		return err
	}
	if lle, ok := err.(*LeaseLostError); ok {
		if lle.HeartbeatErr != nil {
			return err
		}
		cp := *lle
		cp.HeartbeatErr = hb
		return &cp
	}
	if errors.Is(err, ErrLeaseLost) {
		return &LeaseLostError{Op: op, Key: l.Key, Scope: l.Scope, Token: l.Token, Err: err, HeartbeatErr: hb}
	}
	return err
}

// HandlerError is a handler's failure, after it was recorded with idem_fail. Unwrap gives the handler's
// error. errors.Is(err, ErrFailed) holds when the key is now terminal; when recording the failure failed
// (RecordErr), errors.Is also looks there (ErrLeaseLost, a *pgconn.PgError, ...).
type HandlerError struct {
	Key       string
	Scope     string
	Err       error  // what the handler returned (or the panic it raised, as an error)
	Outcome   string // idem_fail's answer: "released" or "failed"; "" when not recorded
	RecordErr error  // why the failure could not be recorded, nil when it was
}

func (e *HandlerError) Error() string {
	switch {
	case e.RecordErr != nil:
		return fmt.Sprintf("idem: handler of key %q failed: %v (recording the failure failed: %v)", e.Key, e.Err, e.RecordErr)
	case e.Outcome != "":
		return fmt.Sprintf("idem: handler of key %q failed (%s): %v", e.Key, e.Outcome, e.Err)
	default:
		return fmt.Sprintf("idem: handler of key %q failed: %v", e.Key, e.Err)
	}
}

// Unwrap gives the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Is matches ErrFailed when the key became terminal, and whatever RecordErr matches.
func (e *HandlerError) Is(target error) bool {
	if target == ErrFailed && e.Outcome == "failed" {
		return true
	}
	return e.RecordErr != nil && errors.Is(e.RecordErr, target)
}

// Terminal reports whether the key is now terminally failed (no later delivery will run the handler).
func (e *HandlerError) Terminal() bool { return e.Outcome == "failed" }

type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks a handler's error as terminal: the key is recorded as failed (idem_fail with
// retryable => false) and later deliveries get ErrFailed without running the handler. Other errors are
// recorded as retryable: the key is released for another attempt, up to idempotency.max_attempts.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// SQLState returns the SQLSTATE of the database error inside err, or "".
func SQLState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// IsRetryable reports whether err is a serialization failure (40001) or a deadlock (40P01): the whole
// transaction should run again (RetryTx does). A lost lease (55006) is not retryable.
func IsRetryable(err error) bool {
	switch SQLState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// RetryTx runs fn in a transaction and commits it; when fn or the commit fails with a serialization
// failure or a deadlock (IsRetryable), it rolls back and runs fn again in a new transaction, at most
// maxAttempts times in all (0 means 5), with a short random pause between attempts. Any other error
// rolls back and is returned as is; the last retryable error is returned when the attempts run out.
// fn must not commit or roll back tx.
func RetryTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, maxAttempts int, fn func(tx pgx.Tx) error) error {
	if maxAttempts <= 0 {
		maxAttempts = 5
	}
	var err error
	for attempt := 1; ; attempt++ {
		err = runTx(ctx, db, opts, fn)
		if err == nil || !IsRetryable(err) || attempt >= maxAttempts {
			return err
		}
		pause := time.Duration(rand.Int63n(int64(attempt) * int64(10*time.Millisecond)))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

func runTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("idem: begin: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(context.Background())
			panic(p)
		}
	}()
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.Background())
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("idem: commit: %w", err)
	}
	return nil
}
