package idem

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v4"
)

// HTTPMode is how the HTTP middleware runs a handler with a key.
type HTTPMode string

const (
	// OneTransaction (the default): BEGIN, idem_claim, the handler in that transaction, idem_complete with
	// the response, COMMIT; a handler that answers 5xx or panics rolls it all back.
	OneTransaction HTTPMode = "one-transaction"
	// TwoTransactions: the claim commits a lease and a fencing token, heartbeats extend it while the
	// handler runs in a second transaction, which completes with the token; a lease taken over meanwhile
	// rolls that transaction back.
	TwoTransactions HTTPMode = "two-transactions"
)

// Route chooses the requests the middleware handles: Method ("*": any) and a path Pattern (see
// PathMatches). Require: a request without Idempotency-Key gets 400. Mode: "" for the HTTP's.
type Route struct {
	Method, Pattern string
	Require         bool
	Mode            HTTPMode
}

// HTTPDB is what the middleware needs of a database: a *pgxpool.Pool.
type HTTPDB interface {
	TxBeginner
	Querier
}

// HTTP is the Idempotency-Key middleware for net/http: Middleware is a func(http.Handler) http.Handler.
// The handler finds its transaction with FromRequest. What it answers, stores and keeps: docs/http.md.
type HTTP struct {
	DB     HTTPDB
	Routes []Route // nil: POST and PATCH on every path, key optional
	Mode   HTTPMode
	// Lease is the lease of two-transaction mode (0: 30 s), extended every HeartbeatEvery (0: Lease/3).
	Lease          time.Duration
	HeartbeatEvery time.Duration
	// Scope names the tenant or user whose keys these are ("" or nil: DefaultScope, itself "http" when "").
	Scope        func(*http.Request) string
	DefaultScope string
	// Fingerprint replaces the default RequestFingerprint(method, RequestURI, body); "" turns the check off.
	Fingerprint  func(r *http.Request, body []byte) string
	KeepHeaders  []string // headers a replay gives back; nil: Content-Type and Location
	MaxBodyBytes int64    // a larger body is refused with 413 before the handler runs; 0: 1 MiB
	MaxKeyLength int      // 0: MaxKeyLength
	// Wait: a concurrent request waits for the holder's transaction and replays it, instead of 409 at once.
	Wait bool
	// RetryAfter of a 409 whose lease end is unknown (one-transaction mode); 0: 1 s.
	RetryAfter  time.Duration
	ProblemBase string        // a URI the problem type is made of; "": about:blank
	TxOptions   pgx.TxOptions // of the handler's transaction
	// OnError hears of the database errors answered with a bare 500, and of heartbeat errors.
	OnError func(r *http.Request, err error)
}

// HTTPRequest is what the handler gets from FromRequest: Tx, the transaction that commits with the stored
// response (write there; never commit or roll back); Key ("": the request came without one, and only the
// transaction applies); Scope; Mode; in two-transaction mode Token, the fencing token, and the request's
// context is cancelled when a heartbeat finds the lease taken over.
type HTTPRequest struct {
	Tx          pgx.Tx
	Key, Scope  string
	Mode        HTTPMode
	Fingerprint string
	Token       int64
}

type httpRequestKey struct{}

// FromRequest is the HTTPRequest of a request the middleware handles, nil otherwise.
func FromRequest(r *http.Request) *HTTPRequest {
	v, _ := r.Context().Value(httpRequestKey{}).(*HTTPRequest)
	return v
}

var defaultRoutes = []Route{{Method: "POST", Pattern: "/**"}, {Method: "PATCH", Pattern: "/**"}}

func (h *HTTP) route(r *http.Request) *Route {
	routes := h.Routes
	if routes == nil {
		routes = defaultRoutes
	}
	for i := range routes {
		if (routes[i].Method == "*" || routes[i].Method == r.Method) && PathMatches(routes[i].Pattern, r.URL.Path) {
			return &routes[i]
		}
	}
	return nil
}

func (h *HTTP) problem(w http.ResponseWriter, code, detail string, retryAfter time.Duration) {
	status, body := Problem(code, h.ProblemBase, detail)
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (h *HTTP) fail(w http.ResponseWriter, r *http.Request, err error) {
	if h.OnError != nil {
		h.OnError(r, err)
	}
	http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
}

// refused answers a claim that did not give the key: 409 (with Retry-After), 422, or 500 for a failed key.
func (h *HTTP) refused(w http.ResponseWriter, c Claim) {
	switch c.Outcome {
	case Mismatch:
		h.problem(w, "idempotency-key-reused", "", 0)
	case Failed:
		h.problem(w, "idempotency-key-failed", "", 0)
	default:
		wait := h.RetryAfter
		if wait <= 0 {
			wait = time.Second
		}
		if !c.ExpiresAt.IsZero() {
			if wait = time.Until(c.ExpiresAt); wait < time.Second {
				wait = time.Second
			}
		}
		h.problem(w, "idempotency-key-in-use", "", wait)
	}
}

// Middleware wraps next: the requests of the Routes get the Idempotency-Key treatment, others pass.
func (h *HTTP) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := h.route(r)
		if route == nil {
			next.ServeHTTP(w, r)
			return
		}
		var key string
		switch fields := r.Header.Values("Idempotency-Key"); {
		case len(fields) > 1:
			h.problem(w, "idempotency-key-invalid", "more than one Idempotency-Key field", 0)
			return
		case len(fields) == 1:
			var err error
			if key, err = ParseKey(fields[0], h.MaxKeyLength); err != nil {
				h.problem(w, "idempotency-key-invalid", err.(*KeyFieldError).Reason, 0)
				return
			}
		case route.Require:
			h.problem(w, "idempotency-key-missing", "", 0)
			return
		}
		limit := h.MaxBodyBytes
		if limit <= 0 {
			limit = 1 << 20
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		if r.ContentLength > limit || int64(len(body)) > limit {
			h.problem(w, "request-too-large", "The request body is larger than "+strconv.FormatInt(limit, 10)+" bytes.", 0)
			return
		}
		if err != nil {
			return // the client went away
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		info := &HTTPRequest{Key: key, Scope: h.DefaultScope, Mode: route.Mode}
		if h.Scope != nil {
			if s := h.Scope(r); s != "" {
				info.Scope = s
			}
		}
		if info.Scope == "" {
			info.Scope = "http"
		}
		if h.Fingerprint != nil {
			info.Fingerprint = h.Fingerprint(r, body)
		} else {
			info.Fingerprint = RequestFingerprint(r.Method, r.RequestURI, body)
		}
		if info.Mode == "" {
			info.Mode = h.Mode
		}
		if info.Mode == "" {
			info.Mode = OneTransaction
		}
		switch {
		case key == "":
			h.plain(w, r, next, info)
		case info.Mode == TwoTransactions:
			h.twoTransactions(w, r, next, info)
		default:
			h.oneTransaction(w, r, next, info)
		}
	})
}
