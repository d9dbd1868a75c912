package lockd

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultURL is lockd's default address.
const DefaultURL = "http://127.0.0.1:7070"

// maxWait is lockd's cap on one request's wait; longer waits are split into several requests.
const maxWait = 300 * time.Second

// Options configure a Client or a FencedWriter; the zero value is usable.
type Options struct {
	// APIKey is sent as "Authorization: Bearer <key>" when not empty.
	APIKey string
	// Timeout bounds each request (a waiting acquire gets its wait on top); default 10 s.
	Timeout time.Duration
	// Owner labels acquires for humans (lockctl status, the 409 body); default "go-client".
	Owner string
	// TLS is the TLS configuration of https URLs: RootCAs for a private CA, Certificates
	// for mTLS (see TLSConfig). Nil: Go's defaults.
	TLS *tls.Config
	// HTTPClient replaces the client built from Timeout and TLS (its Timeout is not used:
	// each request carries its own deadline).
	HTTPClient *http.Client
}

// TLSConfig builds a *tls.Config from PEM files: caFile (the CA that signed the server's
// certificate; "" for the system's), and certFile/keyFile (this client's certificate for
// mTLS; "" for none).
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("lockd: no certificate in %s", caFile)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// httpDoer sends requests to one base URL with the options' key and timeout.
type httpDoer struct {
	base    string
	opts    Options
	http    *http.Client
	timeout time.Duration
}

func newDoer(base string, opts Options) httpDoer {
	hc := opts.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if opts.TLS != nil {
			tr.TLSClientConfig = opts.TLS
		}
		hc = &http.Client{Transport: tr}
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return httpDoer{base: strings.TrimRight(base, "/"), opts: opts, http: hc, timeout: timeout}
}

// do sends one request (body as JSON when not nil) with the given timeout (0: the default)
// and decodes a 2xx JSON answer into out (when not nil). Errors: *Error or *StaleTokenError.
func (d httpDoer) do(ctx context.Context, method, path string, header http.Header, body any,
	timeout time.Duration, out any) (http.Header, error) {
	if timeout <= 0 {
		timeout = d.timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var reader io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, invalid("%s %s: body: %v", method, path, err)
		}
		reader = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, reader)
	if err != nil {
		return nil, invalid("%s %s: %v", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if d.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+d.opts.APIKey)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, unavailable(fmt.Sprintf("%s %s: cannot reach %s", method, path, d.base), err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, unavailable(fmt.Sprintf("%s %s: reading the answer", method, path), err)
	}
	if resp.StatusCode >= 300 {
		return resp.Header, errorFromResponse(resp, raw)
	}
	if out != nil && len(raw) > 0 && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.Header, &Error{Kind: ErrProtocol, Status: resp.StatusCode,
				Detail: fmt.Sprintf("%s %s: answer is not the expected JSON: %v", method, path, err)}
		}
	}
	return resp.Header, nil
}

// Client talks to one lockd. It is safe for concurrent use.
type Client struct {
	d httpDoer
}

// New returns a client of the lockd at baseURL (e.g. DefaultURL).
func New(baseURL string, opts Options) *Client {
	if opts.Owner == "" {
		opts.Owner = "go-client"
	}
	return &Client{d: newDoer(baseURL, opts)}
}

// URL is the client's base URL, without a trailing slash.
func (c *Client) URL() string { return c.d.base }

// pathOf is root + name with each segment percent-escaped; a name with an empty, "." or
// ".." segment is refused before any request (HTTP stacks would rewrite it).
func pathOf(root, name string) (string, error) {
	if name == "" {
		return "", invalid("a name must not be empty")
	}
	segs := strings.Split(name, "/")
	for i, s := range segs {
		if s == "" || s == "." || s == ".." {
			return "", invalid("name %q has an empty, '.' or '..' segment", name)
		}
		segs[i] = strings.ReplaceAll(url.PathEscape(s), "%3A", ":")
	}
	return root + strings.Join(segs, "/"), nil
}

// LockStatus is what GET /v1/locks/{name} says of a lock (never a lease id).
type LockStatus struct {
	Lock    string `json:"lock"`
	Held    bool   `json:"held"`
	Fence   int64  `json:"fence"`
	Owner   string `json:"owner"`
	TTLms   int64  `json:"ttl_ms"`
	Waiters int    `json:"waiters"`
}

// Status returns the lock's state: held or not, its last issued fence, its holder's owner.
func (c *Client) Status(ctx context.Context, name string) (*LockStatus, error) {
	path, err := pathOf("/v1/locks/", name)
	if err != nil {
		return nil, err
	}
	var st LockStatus
	if _, err := c.d.do(ctx, "GET", path, nil, nil, 0, &st); err != nil {
		return nil, err
	}
	return &st, nil
}
