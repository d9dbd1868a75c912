package lockd_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"lockd.dev/lockd"
)

// Over https with mTLS (TLS_LOCKD_URL, TLS_PROXY_URL: both ask for a client certificate
// signed by TLS_CA; TLS_CLIENT_CERT/KEY is one): the client trusting the CA and presenting its
// certificate acquires and writes through the proxy; without the certificate, or without
// trusting the CA, nothing is granted. tests/clients provides the servers and the PKI.
func TestTLSAndMTLS(t *testing.T) {
	lockdURL, proxyURL := os.Getenv("TLS_LOCKD_URL"), os.Getenv("TLS_PROXY_URL")
	ca, cert, key := os.Getenv("TLS_CA"), os.Getenv("TLS_CLIENT_CERT"), os.Getenv("TLS_CLIENT_KEY")
	if lockdURL == "" {
		t.Skip("TLS_LOCKD_URL not set")
	}
	ctx := context.Background()
	cfg, err := lockd.TLSConfig(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c := lockd.New(lockdURL, lockd.Options{TLS: cfg})
	lease, err := c.Acquire(ctx, "items", lockd.AcquireOptions{TTL: 3 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	w := lockd.NewFencedWriter(proxyURL, lease, lockd.Options{TLS: cfg})
	if _, err := w.Upsert(ctx, "items", "go-tls", lockd.Row{"id": "go-tls", "v": "tls", "n": 7}); err != nil {
		t.Fatal(err)
	}
	row, err := w.Get(ctx, "items", "go-tls")
	if err != nil || row["n"] != float64(7) {
		t.Fatalf("row %v %v", row, err)
	}

	noCert, err := lockd.TLSConfig(ca, "", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockd.New(lockdURL, lockd.Options{TLS: noCert}).Acquire(ctx, "go-tls/x", lockd.AcquireOptions{TTL: time.Second})
	if !errors.Is(err, lockd.ErrUnavailable) {
		t.Fatalf("without a client certificate: %v", err)
	}
	_, err = lockd.New(lockdURL, lockd.Options{}).Acquire(ctx, "go-tls/x", lockd.AcquireOptions{TTL: time.Second})
	if !errors.Is(err, lockd.ErrUnavailable) {
		t.Fatalf("without trusting the CA: %v", err)
	}
	if _, err := lockd.TLSConfig("/nonexistent/ca.pem", "", ""); err == nil {
		t.Fatal("a missing CA file must be an error")
	}
}
