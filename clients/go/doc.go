// Package lockd is the Go client of lockd, a lock service whose leases carry fencing tokens.
//
// A Client talks to one lockd over HTTP. Acquire returns a Lease that renews itself in the
// background every TTL/3 (measured from when the previous request was sent) and is considered
// lost, conservatively, once TTL has passed since the last successful renewal was sent: Done()
// is closed then and Err() says why. Hand the lease's token to the resource proxy with a
// FencedWriter: a write from a holder that was superseded fails with *StaleTokenError.
//
//	c := lockd.New("http://127.0.0.1:7070", lockd.Options{})
//	lease, err := c.Acquire(ctx, "jobs/nightly", lockd.AcquireOptions{TTL: 10 * time.Second, Wait: time.Minute})
//	if err != nil { return err }
//	defer lease.Release(context.Background())
//	w := lockd.NewFencedWriter("http://127.0.0.1:7071", lease, lockd.Options{})
//	_, err = w.Upsert(ctx, "reports", "7", map[string]any{"id": 7, "state": "done"})
//
// Errors are values: every error of a request is an *Error whose Kind (ErrHeld,
// ErrLeaseLost, ErrStaleToken, ...) errors.Is matches; a stale write is also an
// *StaleTokenError (errors.As) carrying Presented and Highest.
//
// The module uses nothing outside Go's standard library.
package lockd
