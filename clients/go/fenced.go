package lockd

import (
	"context"
	"net/http"
	"net/url"
)

// FencedWriter writes rows through the resource proxy with a lease's token in the
// Fencing-Token header. A write from a superseded holder fails with *StaleTokenError
// (errors.Is(err, ErrStaleToken)); see the Err* kinds for the others.
type FencedWriter struct {
	d     httpDoer
	lease *Lease
}

// NewFencedWriter returns a writer to the proxy at proxyURL under lease (opts: API key,
// timeout, TLS as for New).
func NewFencedWriter(proxyURL string, lease *Lease, opts Options) *FencedWriter {
	return &FencedWriter{d: newDoer(proxyURL, opts), lease: lease}
}

// Row is a table row as JSON: column name to value.
type Row = map[string]any

func (w *FencedWriter) header() http.Header {
	return http.Header{"Fencing-Token": []string{w.lease.Token()}}
}

func rowPath(table, key string) string {
	p := "/v1/tables/" + url.PathEscape(table) + "/rows"
	if key != "" {
		p += "/" + url.PathEscape(key)
	}
	return p
}

// Claim raises the proxy's highest fence of every lock of the lease's token to the lease's
// fence without writing, so an older holder's later write is refused from now on.
func (w *FencedWriter) Claim(ctx context.Context) error {
	_, err := w.d.do(ctx, "POST", "/v1/fences/claim", w.header(), nil, 0, nil)
	return err
}

// Insert inserts row into table (POST; 201).
func (w *FencedWriter) Insert(ctx context.Context, table string, row Row) (Row, error) {
	var out Row
	_, err := w.d.do(ctx, "POST", rowPath(table, ""), w.header(), row, 0, &out)
	return out, err
}

// Upsert inserts or replaces the row of key (PUT).
func (w *FencedWriter) Upsert(ctx context.Context, table, key string, row Row) (Row, error) {
	var out Row
	_, err := w.d.do(ctx, "PUT", rowPath(table, key), w.header(), row, 0, &out)
	return out, err
}

// Update changes the given columns of the row of key (PATCH; ErrNotFound if absent).
func (w *FencedWriter) Update(ctx context.Context, table, key string, changes Row) (Row, error) {
	var out Row
	_, err := w.d.do(ctx, "PATCH", rowPath(table, key), w.header(), changes, 0, &out)
	return out, err
}

// Delete deletes the row of key (ErrNotFound if absent).
func (w *FencedWriter) Delete(ctx context.Context, table, key string) error {
	_, err := w.d.do(ctx, "DELETE", rowPath(table, key), w.header(), nil, 0, nil)
	return err
}

// Get reads the row of key with the token attached (a fenced read).
func (w *FencedWriter) Get(ctx context.Context, table, key string) (Row, error) {
	var out Row
	_, err := w.d.do(ctx, "GET", rowPath(table, key), w.header(), nil, 0, &out)
	return out, err
}
