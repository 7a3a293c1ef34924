package idem

// The HTTP middleware's three ways of running a handler (http.go): without a key, in one transaction,
// in two; and the response it keeps until the transaction is settled.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// capture keeps a handler's response until its transaction is settled.
type capture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }
func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}
func (c *capture) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return c.body.Write(b)
}

// kept: whether the response commits (a status below 500); a response without a Content-Type gets the
// one net/http would have sniffed, so that a replay has it too.
func (c *capture) kept() bool {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.header.Get("Content-Type") == "" && c.body.Len() > 0 {
		c.header.Set("Content-Type", http.DetectContentType(c.body.Bytes()))
	}
	return c.status < 500
}

func (c *capture) send(w http.ResponseWriter) {
	for k, v := range c.header {
		w.Header()[k] = v
	}
	w.WriteHeader(c.status)
	_, _ = w.Write(c.body.Bytes())
}

func (h *HTTP) stored(c *capture) json.RawMessage {
	keep := h.KeepHeaders
	if keep == nil {
		keep = []string{"Content-Type", "Location"}
	}
	b, _ := json.Marshal(NewStoredResponse(c.status, c.header, c.body.Bytes(), keep))
	return b
}

// serve runs next with the captured writer; a panic is returned (to be raised again once the
// transaction is settled).
func serve(next http.Handler, c *capture, r *http.Request) (panicked interface{}) {
	defer func() { panicked = recover() }()
	next.ServeHTTP(c, r)
	return nil
}

func replay(w http.ResponseWriter, payload json.RawMessage) error {
	var sr StoredResponse
	if err := json.Unmarshal(payload, &sr); err != nil {
		return err
	}
	status, header, body, err := sr.Replay()
	if err != nil {
		return err
	}
	for k, v := range header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return nil
}

// claimed reports whether the claim gave the key; otherwise it answered: the stored response (completed),
// a problem (in_progress, mismatch, failed), or a bare 500 (a database error).
func (h *HTTP) claimed(w http.ResponseWriter, r *http.Request, claim Claim, err error) bool {
	switch {
	case err != nil:
		h.fail(w, r, err)
	case claim.Outcome == Completed:
		if err := replay(w, claim.Payload); err != nil {
			h.fail(w, r, err)
		}
	case claim.Outcome != Claimed:
		h.refused(w, claim)
	default:
		return true
	}
	return false
}

// plain: a request without a key, in a transaction of its own.
func (h *HTTP) plain(w http.ResponseWriter, r *http.Request, next http.Handler, info *HTTPRequest) {
	ctx := r.Context()
	tx, err := h.DB.BeginTx(ctx, h.TxOptions)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	info.Tx = tx
	c := &capture{header: http.Header{}}
	p := serve(next, c, r.WithContext(context.WithValue(ctx, httpRequestKey{}, info)))
	if p != nil || !c.kept() {
		_ = tx.Rollback(context.Background())
		if p != nil {
			panic(p)
		}
	} else if err := tx.Commit(ctx); err != nil {
		h.fail(w, r, err)
		return
	}
	c.send(w)
}

func (h *HTTP) oneTransaction(w http.ResponseWriter, r *http.Request, next http.Handler, info *HTTPRequest) {
	ctx := r.Context()
	tx, err := h.DB.BeginTx(ctx, h.TxOptions)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // after a commit: nothing
	claim, err := ClaimKey(ctx, tx, info.Key, ClaimOptions{Scope: info.Scope, Fingerprint: info.Fingerprint, NoWait: !h.Wait})
	if !h.claimed(w, r, claim, err) {
		return
	}
	info.Tx = tx
	c := &capture{header: http.Header{}}
	p := serve(next, c, r.WithContext(context.WithValue(ctx, httpRequestKey{}, info)))
	if p != nil {
		_ = tx.Rollback(context.Background())
		panic(p)
	}
	if !c.kept() {
		_ = tx.Rollback(context.Background()) // the key and the handler's writes vanish: a retry runs again
		c.send(w)
		return
	}
	if err := Complete(ctx, tx, Lease{Key: info.Key, Scope: info.Scope}, h.stored(c)); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		h.fail(w, r, err)
		return
	}
	c.send(w)
}

func (h *HTTP) twoTransactions(w http.ResponseWriter, r *http.Request, next http.Handler, info *HTTPRequest) {
	ctx := r.Context()
	ttl := h.Lease
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	claim, err := ClaimKey(ctx, h.DB, info.Key, ClaimOptions{Scope: info.Scope, TTL: ttl,
		Fingerprint: info.Fingerprint, NoWait: !h.Wait}) // commits by itself
	if !h.claimed(w, r, claim, err) {
		return
	}
	lease := claim.Lease()
	info.Token = lease.Token
	every := h.HeartbeatEvery
	if every == 0 {
		every = ttl / 3
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var onErr func(string, error)
	if h.OnError != nil {
		onErr = func(_ string, err error) { h.OnError(r, err) }
	}
	k := keepAlive(ctx, cancel, PGStore{DB: h.DB}, lease, ttl, every, onErr)
	release := func(doc map[string]interface{}) { // idem_fail with the token: released for a retry
		b, _ := json.Marshal(doc)
		if _, err := Fail(ctx, h.DB, lease, b, true); err != nil && h.OnError != nil {
			h.OnError(r, err)
		}
	}
	tx, err := h.DB.BeginTx(ctx, h.TxOptions)
	if err != nil {
		k.end()
		release(map[string]interface{}{"error": "begin", "message": err.Error()})
		h.fail(w, r, err)
		return
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	info.Tx = tx
	c := &capture{header: http.Header{}}
	p := serve(next, c, r.WithContext(context.WithValue(hctx, httpRequestKey{}, info)))
	lost, _ := k.end()
	switch {
	case lost != nil:
		_ = tx.Rollback(context.Background())
		h.problem(w, "idempotency-lease-lost", "", time.Second)
		return
	case p != nil:
		_ = tx.Rollback(context.Background())
		release(map[string]interface{}{"error": "panic", "message": fmt.Sprint(p)})
		panic(p)
	case !c.kept():
		_ = tx.Rollback(context.Background())
		release(map[string]interface{}{"error": "status", "status": c.status})
		c.send(w)
		return
	}
	err = Complete(ctx, tx, lease, h.stored(c))
	if err == nil {
		err = tx.Commit(ctx)
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		h.problem(w, "idempotency-lease-lost", "", time.Second)
	case err != nil:
		_ = tx.Rollback(context.Background())
		release(map[string]interface{}{"error": "complete", "message": err.Error()})
		h.fail(w, r, err)
	default:
		c.send(w)
	}
}
