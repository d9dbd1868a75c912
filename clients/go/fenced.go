package lockd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// FencedWriter reads and writes rows through the resource proxy with a lease's token in the
// Fencing-Token header.
//
// Before the first request it sends for a lease it claims the lease's fence at the proxy
// (every fence of a multi-lock lease, in one request), and its reads carry the token too: a
// holder that read under its fence can no longer lose an update to an older holder's late
// write. A write from a superseded holder fails with *StaleTokenError (errors.Is(err,
// ErrStaleToken)), which also marks the lease lost. Insert, Update and Batch carry an
// Idempotency-Key and are resent with it (up to Retries times) after 502 outcome_unknown or
// no answer, so a write that did commit is never applied twice. Safe for concurrent use.
type FencedWriter struct {
	// Retries is how many times Insert, Update and Batch are resent (default 3).
	Retries int

	d       httpDoer
	lease   *Lease
	mu      sync.Mutex
	claimed string // the token whose fences were claimed
}

// NewFencedWriter returns a writer to the proxy at proxyURL under lease (opts: API key,
// timeout, TLS as for New).
func NewFencedWriter(proxyURL string, lease *Lease, opts Options) *FencedWriter {
	return &FencedWriter{Retries: 3, d: newDoer(proxyURL, opts), lease: lease}
}

// Row is a table row as JSON: column name to value.
type Row = map[string]any

// BatchOp is one operation of Batch: Op is "insert", "upsert", "update" or "delete"; Key is
// the row's key (not for insert); Row the row or the changes.
type BatchOp struct {
	Op    string `json:"op"`
	Table string `json:"table"`
	Key   string `json:"key,omitempty"`
	Row   Row    `json:"row,omitempty"`
}

func rowPath(table, key string) string {
	p := "/v1/tables/" + url.PathEscape(table) + "/rows"
	if key != "" {
		p += "/" + url.PathEscape(key)
	}
	return p
}

func (w *FencedWriter) header(idempotencyKey string) http.Header {
	h := http.Header{"Fencing-Token": []string{w.lease.Token()}}
	if idempotencyKey != "" {
		h.Set("Idempotency-Key", idempotencyKey)
	}
	return h
}

// claimPath is where the lease's fences are claimed: the lock's own route, or
// /v1/fences/claim for a multi-lock lease.
func (w *FencedWriter) claimPath() string {
	if len(w.lease.Fences) > 1 || strings.Contains(w.lease.Lock, ",") {
		return "/v1/fences/claim"
	}
	p, _ := pathOf("/v1/fences/", w.lease.Lock)
	return p + "/claim"
}

// Claim raises the proxy's highest fence of every lock of the lease to the lease's fence
// without writing, so an older holder's later write is refused from now on. The first
// request of a writer does this by itself.
func (w *FencedWriter) Claim(ctx context.Context) error {
	token := w.lease.Token()
	_, err := w.d.do(ctx, "POST", w.claimPath(), w.header(""), nil, 0, nil)
	if err != nil {
		return w.seen(err)
	}
	w.mu.Lock()
	w.claimed = token
	w.mu.Unlock()
	return nil
}

func (w *FencedWriter) ensureClaimed(ctx context.Context) error {
	w.mu.Lock()
	done := w.claimed == w.lease.Token()
	w.mu.Unlock()
	if done {
		return nil
	}
	return w.Claim(ctx)
}

// seen marks the lease lost on a stale token (a newer grant exists) and returns err.
func (w *FencedWriter) seen(err error) error {
	var stale *StaleTokenError
	if errors.As(err, &stale) {
		w.lease.finish(Lost, &Error{Kind: ErrLeaseLost, Code: "stale_token", Lock: stale.Lock,
			Detail: "a newer grant exists: " + stale.Error()})
	}
	return err
}

// send claims first if needed, then sends one request; with retry, it carries an
// Idempotency-Key and is resent after outcome_unknown or no answer.
func (w *FencedWriter) send(ctx context.Context, method, path string, body any, retry bool, out any) error {
	if err := w.ensureClaimed(ctx); err != nil {
		return err
	}
	key := ""
	attempts := 1
	if retry {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		key, attempts = hex.EncodeToString(b), 1+w.Retries
	}
	var err error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			if serr := sleepCtx(ctx, time.Duration(50<<(i-1))*time.Millisecond); serr != nil {
				return serr
			}
		}
		_, err = w.d.do(ctx, method, path, w.header(key), body, 0, out)
		var e *Error
		transient := errors.Is(err, ErrOutcomeUnknown) || (errors.As(err, &e) && e.Kind == ErrUnavailable && e.Status == 0)
		if !transient {
			break
		}
	}
	return w.seen(err)
}

// Insert inserts row into table (POST; 201), with an Idempotency-Key.
func (w *FencedWriter) Insert(ctx context.Context, table string, row Row) (Row, error) {
	var out Row
	err := w.send(ctx, "POST", rowPath(table, ""), row, true, &out)
	return out, err
}

// Upsert inserts or replaces the row of key (PUT; idempotent).
func (w *FencedWriter) Upsert(ctx context.Context, table, key string, row Row) (Row, error) {
	var out Row
	err := w.send(ctx, "PUT", rowPath(table, key), row, false, &out)
	return out, err
}

// Update changes the given columns of the row of key (PATCH; ErrNotFound if absent), with
// an Idempotency-Key.
func (w *FencedWriter) Update(ctx context.Context, table, key string, changes Row) (Row, error) {
	var out Row
	err := w.send(ctx, "PATCH", rowPath(table, key), changes, true, &out)
	return out, err
}

// Delete deletes the row of key (ErrNotFound if absent).
func (w *FencedWriter) Delete(ctx context.Context, table, key string) error {
	return w.send(ctx, "DELETE", rowPath(table, key), nil, false, nil)
}

// Get reads the row of key with the token attached (a fenced read; ErrNotFound if absent).
func (w *FencedWriter) Get(ctx context.Context, table, key string) (Row, error) {
	var out Row
	err := w.send(ctx, "GET", rowPath(table, key), nil, false, &out)
	return out, err
}

// Batch applies ops in one transaction under one fence check, all or none (POST /v1/batch),
// with an Idempotency-Key; it returns the proxy's answer.
func (w *FencedWriter) Batch(ctx context.Context, ops []BatchOp) (map[string]any, error) {
	var out map[string]any
	err := w.send(ctx, "POST", "/v1/batch", map[string]any{"ops": ops}, true, &out)
	return out, err
}
