package lockd

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
)

func newClientID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func ms(d time.Duration) int64 { return int64((d + time.Millisecond/2) / time.Millisecond) }

// Acquire acquires lock name for opts.TTL, waiting up to opts.Wait. Errors: ErrHeld when not
// granted within the wait (an *Error with the holder's owner in Problem), ErrInvalid for a
// bad name or TTL (nothing sent), ErrUnavailable when lockd did not answer within the wait
// (every retry sends the same client_id, so a lost answer never costs a second lease),
// ctx.Err() when ctx ended first.
func (c *Client) Acquire(ctx context.Context, name string, opts AcquireOptions) (*Lease, error) {
	path, err := pathOf("/v1/locks/", name)
	if err != nil {
		return nil, err
	}
	extra := map[string]any{}
	if opts.Shared {
		extra["mode"] = "shared"
	}
	r := route{acquire: path + "/acquire", renew: path + "/renew", release: path + "/release",
		extra: extra, what: fmt.Sprintf("lock %q", name)}
	return c.acquire(ctx, r, opts)
}

// AcquireMany acquires every lock of names in one step (all or none) as one lease whose
// token carries each lock's fence (Lease.Fences). opts.SharedLocks names those held shared.
func (c *Client) AcquireMany(ctx context.Context, names []string, opts AcquireOptions) (*Lease, error) {
	if len(names) == 0 {
		return nil, invalid("AcquireMany needs at least one lock name")
	}
	seen := map[string]bool{}
	for _, n := range names {
		if _, err := pathOf("/v1/locks/", n); err != nil {
			return nil, err
		}
		if seen[n] {
			return nil, invalid("lock %q named twice", n)
		}
		seen[n] = true
	}
	extra := map[string]any{"locks": names}
	if len(opts.SharedLocks) > 0 {
		modes := map[string]string{}
		for _, n := range opts.SharedLocks {
			if !seen[n] {
				return nil, invalid("shared lock %q is not in the set", n)
			}
			modes[n] = "shared"
		}
		extra["modes"] = modes
	}
	r := route{acquire: "/v1/leases/acquire", renew: "/v1/leases/renew",
		release: "/v1/leases/release", extra: extra,
		what: "locks " + strings.Join(names, ",")}
	return c.acquire(ctx, r, opts)
}

func (c *Client) acquire(ctx context.Context, r route, opts AcquireOptions) (*Lease, error) {
	l, body, err := c.acquireBody(ctx, r, opts)
	if err != nil {
		return nil, err
	}
	l.apply(body)
	l.start()
	return l, nil
}

// acquireBody runs the acquire rule: ask within the wait (each request's wait_ms is what
// is left, capped at 300 s); an early 409 is asked again after 50 ms; no answer or a 5xx
// is retried with a doubling pause up to 1 s, and returned once the wait is over. A grant
// that came a third of the TTL or more after its request was sent is renewed at once, so
// the lease's local deadline is measured from a fresh send time.
func (c *Client) acquireBody(ctx context.Context, r route, opts AcquireOptions) (*Lease, *leaseBody, error) {
	if opts.TTL <= 0 {
		return nil, nil, invalid("TTL must be > 0, got %v", opts.TTL)
	}
	renewEvery := opts.RenewEvery
	if renewEvery == 0 {
		renewEvery = opts.TTL / 3
	}
	if renewEvery <= 0 || renewEvery >= opts.TTL {
		return nil, nil, invalid("RenewEvery must be > 0 and < TTL (%v), got %v", opts.TTL, opts.RenewEvery)
	}
	owner := opts.Owner
	if owner == "" {
		owner = c.d.opts.Owner
	}
	clientID := opts.ClientID
	if clientID == "" {
		clientID = newClientID()
	}
	started := time.Now()
	var deadline time.Time
	forever := opts.Wait < 0
	if !forever {
		deadline = started.Add(opts.Wait)
	}
	backoff := 50 * time.Millisecond
	var last error
	for {
		wait := maxWait
		if !forever {
			wait = time.Until(deadline)
			if wait < 0 {
				wait = 0
			}
			if wait > maxWait {
				wait = maxWait
			}
		}
		req := map[string]any{"ttl_ms": ms(opts.TTL), "wait_ms": int64(wait / time.Millisecond),
			"owner": owner, "client_id": clientID}
		for k, v := range r.extra {
			req[k] = v
		}
		sent := time.Now()
		var body leaseBody
		_, err := c.d.do(ctx, "POST", r.acquire, nil, req, c.d.timeout+wait, &body)
		if err == nil {
			err = body.check()
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, nil, ctxErr
		}
		switch {
		case err == nil:
			l := &Lease{c: c, r: r, renewEvery: renewEvery, TTL: opts.TTL, state: Held,
				deadline: sent.Add(opts.TTL), done: make(chan struct{}), stop: make(chan struct{})}
			if opts.NoRenew {
				l.stopOnce.Do(func() { close(l.stop) })
			}
			if time.Since(sent) >= opts.TTL/3 {
				fresh := time.Now()
				var renewed leaseBody
				_, rerr := c.d.do(ctx, "POST", r.renew, nil,
					map[string]any{"lease_id": body.LeaseID, "ttl_ms": ms(opts.TTL)}, 0, &renewed)
				if errors.Is(rerr, ErrLeaseLost) {
					continue // lost before we could renew it: ask again within the wait
				}
				if rerr == nil && renewed.check() == nil {
					body, l.deadline = renewed, fresh.Add(opts.TTL)
				}
			}
			return l, &body, nil
		case errors.Is(err, ErrHeld):
			last = err
			if !forever && time.Until(deadline) < time.Millisecond {
				return nil, nil, last
			}
			if time.Since(sent) < wait/2 {
				if err := sleepCtx(ctx, minDur(50*time.Millisecond, left(deadline, forever))); err != nil {
					return nil, nil, err
				}
			}
		case errors.Is(err, ErrUnavailable):
			if !forever && time.Until(deadline) < time.Millisecond {
				return nil, nil, err
			}
			if err := sleepCtx(ctx, minDur(backoff, left(deadline, forever))); err != nil {
				return nil, nil, err
			}
			backoff = minDur(backoff*2, time.Second)
		default:
			return nil, nil, err
		}
	}
}

func left(deadline time.Time, forever bool) time.Duration {
	if forever {
		return time.Hour
	}
	if d := time.Until(deadline); d > 0 {
		return d
	}
	return 0
}

func minDur(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
