package lockd

import (
	"context"
	"fmt"
)

// Permit is one of a semaphore's limit permits: a lease whose token names the lock
// "sem/{semaphore}/{slot}" and whose fence increases strictly per semaphore.
type Permit struct {
	*Lease
	// Semaphore is the semaphore's name.
	Semaphore string
	// Slot is the permit's slot, 0 .. Limit-1.
	Slot int
	// Limit is the semaphore's number of permits.
	Limit int
}

// AcquirePermit takes one of limit permits of semaphore name, waiting up to opts.Wait.
// Errors as Acquire's, plus ErrLimitMismatch when the semaphore's held permits were taken
// with another limit.
func (c *Client) AcquirePermit(ctx context.Context, name string, limit int, opts AcquireOptions) (*Permit, error) {
	if limit < 1 {
		return nil, invalid("limit must be >= 1, got %d", limit)
	}
	path, err := pathOf("/v1/semaphores/", name)
	if err != nil {
		return nil, err
	}
	r := route{acquire: path + "/acquire", renew: path + "/renew", release: path + "/release",
		extra: map[string]any{"limit": limit}, what: fmt.Sprintf("semaphore %q", name)}
	l, body, err := c.acquireBody(ctx, r, opts)
	if err != nil {
		return nil, err
	}
	l.apply(body)
	l.start()
	return &Permit{Lease: l, Semaphore: name, Slot: body.Slot, Limit: body.Limit}, nil
}
