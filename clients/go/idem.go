// Package idem is the Go client of the idempotency PostgreSQL extension: exactly-once processing for
// at-least-once consumers, through the extension's SQL calls (idem_claim, idem_complete, idem_fail,
// idem_heartbeat), with pgx v4.
//
// It offers the two shapes Go teams usually write by hand:
//
//   - Guard (over a Store): a middleware for handlers whose side effects live outside the database.
//     Two-transaction mode: the claim commits a lease and a fencing token, a goroutine extends the lease
//     while the handler runs, and the result is recorded with the token. A lease taken over by another
//     consumer is reported as ErrLeaseLost.
//   - Wrapper (and InTx): runs a handler inside a pgx.Tx. One-transaction mode: claim, the handler's
//     writes and the stored response commit together; a duplicate gets the stored response back without
//     running the handler; a failure is recorded with idem_fail after rolling the handler's work back to
//     a savepoint. Serialization failures and deadlocks (40001, 40P01) are retried.
//
// Errors are typed (errors.Is / errors.As): ErrLeaseLost, ErrInProgress, ErrFailed, ErrMismatch,
// *ClaimError, *LeaseLostError, *HandlerError. A database error is never hidden: it is returned wrapped
// with %w, so errors.As(err, &pgErr) with a *pgconn.PgError still finds it.
//
// Key and Fingerprint derive idempotency keys and request fingerprints exactly as the extension's
// idem_key and idem_fingerprint do.
package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

// Version of this package.
const Version = "0.1.0"

// DefaultScope is the extension's default scope.
const DefaultScope = "default"

// Outcome is what idem_claim answered.
type Outcome string

// The outcomes of idem_claim (see the extension's README).
const (
	Claimed    Outcome = "claimed"     // the caller holds the key now
	Completed  Outcome = "completed"   // already done: Payload is the stored response
	InProgress Outcome = "in_progress" // another holder's lease is live
	Failed     Outcome = "failed"      // terminal failure: Payload is the stored error
	Mismatch   Outcome = "mismatch"    // the key exists with another fingerprint
)

// Querier is what the calls need from a connection: *pgx.Conn, pgx.Tx and *pgxpool.Pool all qualify.
// Outside a transaction (a pool, or a connection with no open transaction) every call commits by itself,
// which is what two-transaction mode wants.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...interface{}) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...interface{}) pgx.Row
}

// TxBeginner starts transactions: *pgx.Conn and *pgxpool.Pool qualify.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// ClaimOptions are idem_claim's optional arguments.
type ClaimOptions struct {
	Scope       string        // "" means DefaultScope
	TTL         time.Duration // lease length; 0 means the server's idempotency.lease_ttl
	Fingerprint string        // "" means none; see Fingerprint
	NoWait      bool          // answer in_progress at once instead of waiting for another open transaction
}

// Claim is idem_claim's answer.
type Claim struct {
	Key       string
	Scope     string
	Outcome   Outcome
	Token     int64           // fencing token (claimed, completed); 0 when NULL
	Attempts  int             // claims of the key so far
	Payload   json.RawMessage // stored response (completed) or error (failed); nil when NULL
	ExpiresAt time.Time       // lease end; zero when NULL
}

// Lease identifies a claim for the calls that follow it. Token 0 means "claimed in this transaction"
// (one-transaction mode: the calls pass NULL).
type Lease struct {
	Key   string
	Scope string
	Token int64
}

// Lease returns the lease of a claimed key.
func (c Claim) Lease() Lease { return Lease{Key: c.Key, Scope: c.Scope, Token: c.Token} }

func scopeOr(s string) string {
	if s == "" {
		return DefaultScope
	}
	return s
}

// ttlArg passes a duration as milliseconds (NULL for 0, meaning the server's default).
func ttlArg(d time.Duration) interface{} {
	if d == 0 {
		return nil
	}
	return float64(d) / float64(time.Millisecond)
}

func tokenArg(t int64) interface{} {
	if t == 0 {
		return nil
	}
	return t
}

func jsonArg(p json.RawMessage) interface{} {
	if len(p) == 0 {
		return nil
	}
	return string(p)
}

// ToPayload turns a handler's result into a stored payload: json.RawMessage and []byte are taken as JSON
// text, nil is NULL, anything else goes through json.Marshal.
func ToPayload(v interface{}) (json.RawMessage, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(x) > 0 && !json.Valid(x) {
			return nil, fmt.Errorf("idem: the handler's result is not valid JSON")
		}
		return x, nil
	case []byte:
		if len(x) > 0 && !json.Valid(x) {
			return nil, fmt.Errorf("idem: the handler's result is not valid JSON")
		}
		return json.RawMessage(x), nil
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("idem: cannot encode the handler's result as JSON: %w", err)
		}
		return b, nil
	}
}

// ClaimKey calls idem_claim. Its outcome is returned as is (no error for in_progress, failed or
// mismatch: see Claim.Err). Database errors come back wrapped, the *pgconn.PgError attached.
func ClaimKey(ctx context.Context, q Querier, key string, opts ClaimOptions) (Claim, error) {
	c := Claim{Key: key, Scope: scopeOr(opts.Scope)}
	var fp interface{}
	if opts.Fingerprint != "" {
		fp = opts.Fingerprint
	}
	var (
		outcome  string
		token    *int64
		attempts *int32
		payload  []byte
		expires  *time.Time
	)
	err := q.QueryRow(ctx,
		`SELECT outcome, token, attempts, payload, expires_at
		   FROM idem_claim($1, ttl => $2::float8 * interval '1 millisecond', scope => $3,
		                   fingerprint => $4, wait => $5)`,
		key, ttlArg(opts.TTL), c.Scope, fp, !opts.NoWait).Scan(&outcome, &token, &attempts, &payload, &expires)
	if err != nil {
		return c, fmt.Errorf("idem: idem_claim(%q, scope %q): %w", key, c.Scope, err)
	}
	c.Outcome = Outcome(outcome)
	if token != nil {
		c.Token = *token
	}
	if attempts != nil {
		c.Attempts = int(*attempts)
	}
	if payload != nil {
		c.Payload = json.RawMessage(payload)
	}
	if expires != nil {
		c.ExpiresAt = *expires
	}
	return c, nil
}

// Err is nil for claimed and completed, and a *ClaimError (ErrInProgress, ErrFailed, ErrMismatch)
// otherwise.
func (c Claim) Err() error {
	switch c.Outcome {
	case Claimed, Completed:
		return nil
	default:
		return &ClaimError{Claim: c}
	}
}

// Complete calls idem_complete with the lease's token (none for Token 0). A lost lease (55006) comes
// back as a *LeaseLostError.
func Complete(ctx context.Context, q Querier, l Lease, payload json.RawMessage) error {
	_, err := q.Exec(ctx, `SELECT idem_complete($1, $2::jsonb, $3, $4)`,
		l.Key, jsonArg(payload), scopeOr(l.Scope), tokenArg(l.Token))
	return callErr("idem_complete", l, err)
}

// Fail calls idem_fail and returns its answer: "released" (another attempt may claim the key) or
// "failed" (terminal). A lost lease (55006) comes back as a *LeaseLostError.
func Fail(ctx context.Context, q Querier, l Lease, errPayload json.RawMessage, retryable bool) (string, error) {
	var out string
	err := q.QueryRow(ctx, `SELECT idem_fail($1, $2::jsonb, $3, $4, $5)`,
		l.Key, jsonArg(errPayload), retryable, scopeOr(l.Scope), tokenArg(l.Token)).Scan(&out)
	return out, callErr("idem_fail", l, err)
}

// Heartbeat calls idem_heartbeat and returns the new end of the lease. A lost lease (55006) comes back
// as a *LeaseLostError.
func Heartbeat(ctx context.Context, q Querier, l Lease, ttl time.Duration) (time.Time, error) {
	var until time.Time
	err := q.QueryRow(ctx, `SELECT idem_heartbeat($1, $2::float8 * interval '1 millisecond', $3, $4)`,
		l.Key, ttlArg(ttl), scopeOr(l.Scope), tokenArg(l.Token)).Scan(&until)
	return until, callErr("idem_heartbeat", l, err)
}

func callErr(op string, l Lease, err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55006" {
		return &LeaseLostError{Op: op, Key: l.Key, Scope: scopeOr(l.Scope), Token: l.Token, Err: err}
	}
	return fmt.Errorf("idem: %s(%q, scope %q, token %d): %w", op, l.Key, scopeOr(l.Scope), l.Token, err)
}

// Result is what a guarded handler produced, or the stored response of an earlier run.
type Result struct {
	Payload  json.RawMessage // the stored response (nil when the handler returned nil)
	Replayed bool            // true: a duplicate, the handler did not run
	Attempts int             // claims of the key so far
	Token    int64           // the fencing token of the run (two-transaction mode) or of the stored record
}
