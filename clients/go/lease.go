package lockd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// WaitForever as AcquireOptions.Wait waits until the lock is granted (or ctx ends).
const WaitForever time.Duration = -1

// AcquireOptions say how to acquire. TTL is required (lockd bounds it); the rest default.
type AcquireOptions struct {
	// TTL is the lease's time to live (whole milliseconds on the wire).
	TTL time.Duration
	// Wait is how long to wait for a held lock: 0 tries once, WaitForever waits until ctx ends.
	Wait time.Duration
	// Owner labels the lease for humans; default the client's Owner.
	Owner string
	// ClientID makes retries idempotent: every request of one Acquire sends it, so a retry
	// after a lost answer gets the same lease. Default: 128 fresh random bits per call.
	ClientID string
	// RenewEvery is the pause between background renewals, measured from when the previous
	// request was sent; default TTL/3. Must be below TTL.
	RenewEvery time.Duration
	// NoRenew turns the background renewal off: the lease is then lost at its local deadline
	// unless renewed with Renew.
	NoRenew bool
	// Shared asks for a shared (read) lease of the lock: shared holders coexist, an exclusive
	// one excludes them all; its token reads through the proxy but never writes.
	Shared bool
	// SharedLocks (AcquireMany only) are the names of the set to hold shared.
	SharedLocks []string
}

// State is where a lease stands, as far as this client can tell.
type State string

// The lease states: Held, Renewed and Unknown are live; Lost and Released are final.
const (
	Held     State = "held"     // acquired, no renewal yet
	Renewed  State = "renewed"  // the last renewal succeeded
	Unknown  State = "unknown"  // the last renewal failed transiently; retrying until the deadline
	Lost     State = "lost"     // lockd answered 410, or the local deadline passed unrenewed
	Released State = "released" // released by this client
)

// route is where a lease's acquire, renew and release go, with the acquire's extra fields.
type route struct {
	acquire, renew, release string
	extra                   map[string]any
	what                    string
}

// leaseBody is every lease answer's shape (lock, permit, leader, multi-lock).
type leaseBody struct {
	Lock              string            `json:"lock"`
	LeaseID           string            `json:"lease_id"`
	Fence             int64             `json:"fence"`
	Token             string            `json:"token"`
	TTLms             int64             `json:"ttl_ms"`
	Owner             string            `json:"owner"`
	Mode              string            `json:"mode"`
	Locks             []lockFence       `json:"locks"`
	Modes             map[string]string `json:"modes"`
	Semaphore         string            `json:"semaphore"`
	Slot              int               `json:"slot"`
	Limit             int               `json:"limit"`
	Election          string            `json:"election"`
	Value             string            `json:"value"`
	HandoverRequested bool              `json:"handover_requested"`
}

type lockFence struct {
	Lock  string `json:"lock"`
	Fence int64  `json:"fence"`
}

func (b *leaseBody) check() error {
	if b.LeaseID == "" || b.Token == "" || (b.Lock == "" && len(b.Locks) == 0) {
		return &Error{Kind: ErrProtocol, Detail: "malformed lease body (lock, lease_id, token)"}
	}
	return nil
}

// Lease is a granted lease, renewed in the background unless NoRenew. Its fields are fixed
// at the grant; Token may change on renewal (read it with Token()).
type Lease struct {
	// Lock is the lock's name (a multi-lock lease: the names joined with ",").
	Lock string
	// LeaseID is the secret that renews and releases; never log it.
	LeaseID string
	// Fence is the lease's fencing token number (a multi-lock lease: the highest).
	Fence int64
	// Fences are the fence of every lock of a multi-lock lease (one entry otherwise).
	Fences map[string]int64
	// TTL is the lease's time to live.
	TTL time.Duration
	// Owner is the lease's label.
	Owner string
	// Shared says the lease is a shared (read) one.
	Shared bool

	c          *Client
	r          route
	renewEvery time.Duration

	mu       sync.Mutex
	token    string
	state    State
	deadline time.Time // sent time of the last successful grant/renewal + TTL (monotonic)
	err      error
	done     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	renewals int
	// renewing is held by the background renewal while it sends; Release takes it after
	// stopping the renewal, so no renewal of this lease is in flight once it releases.
	renewing sync.Mutex
}

// apply takes a grant's or renewal's body.
func (l *Lease) apply(b *leaseBody) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.token = b.Token
	if l.LeaseID == "" {
		l.Lock, l.LeaseID, l.Fence, l.Owner = b.Lock, b.LeaseID, b.Fence, b.Owner
		l.Shared = b.Mode == "shared"
		l.Fences = map[string]int64{}
		if len(b.Locks) > 0 {
			names := make([]string, 0, len(b.Locks))
			for _, lf := range b.Locks {
				names = append(names, lf.Lock)
				l.Fences[lf.Lock] = lf.Fence
				if lf.Fence > l.Fence {
					l.Fence = lf.Fence
				}
			}
			l.Lock = strings.Join(names, ",")
		} else {
			l.Fences[b.Lock] = b.Fence
		}
	}
}

// start runs the background renewal (unless NoRenew) and the local-deadline watch.
func (l *Lease) start() {
	l.wg.Add(1)
	go l.run()
}

// Token is the lease's current token (a compact JWS): what the resource proxy checks.
func (l *Lease) Token() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// State is the lease's state; reading it applies a passed local deadline.
func (l *Lease) State() State {
	l.checkDeadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Deadline is the local deadline: the send time of the last successful acquire or renewal
// plus TTL. lockd started the lease's clock no earlier, so the lease is never believed held
// after lockd expired it.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Renewals is how many renewals of the lease succeeded (background and Renew).
func (l *Lease) Renewals() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewals
}

// Done is closed when the lease is lost or released; Err says which.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while the lease is live; then an *Error of kind ErrLeaseLost (410, or the local
// deadline passed) or, after Release, ErrReleased.
func (l *Lease) Err() error {
	l.checkDeadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// ErrReleased is a released lease's Err: of kind ErrLeaseLost (code "released"), so
// errors.Is(err, ErrLeaseLost) holds for it too.
var ErrReleased error = &Error{Kind: ErrLeaseLost, Code: "released", Detail: "the lease was released"}

// finish moves a live lease to a final state (once) and closes Done.
func (l *Lease) finish(state State, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == Lost || l.state == Released {
		return
	}
	l.state, l.err = state, err
	close(l.done)
}

func (l *Lease) lostByDeadline() error {
	return &Error{Kind: ErrLeaseLost, Code: "local_deadline", Lock: l.Lock,
		Detail: fmt.Sprintf("lease of %q lost: local deadline passed without a renewal", l.Lock)}
}

func (l *Lease) checkDeadline() {
	l.mu.Lock()
	passed := !time.Now().Before(l.deadline)
	l.mu.Unlock()
	if passed {
		l.finish(Lost, l.lostByDeadline())
	}
}

// renewOnce sends one renewal (timeout capped at cap when > 0) and applies its answer.
func (l *Lease) renewOnce(ctx context.Context, ttl time.Duration, cap time.Duration) error {
	sent := time.Now()
	var body leaseBody
	_, err := l.c.d.do(ctx, "POST", l.r.renew, nil,
		map[string]any{"lease_id": l.LeaseID, "ttl_ms": ms(ttl)}, cap, &body)
	if err == nil {
		err = body.check()
	}
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			l.finish(Lost, err)
		}
		return err
	}
	l.mu.Lock()
	if l.state != Lost && l.state != Released {
		l.state = Renewed
		if d := sent.Add(ttl); d.After(l.deadline) { // an older answer arriving late never shortens it
			l.deadline = d
		}
		l.renewals++
	}
	l.mu.Unlock()
	l.apply(&body)
	return nil
}

// Renew renews the lease now for its TTL. A lease already lost or released returns its
// Err without a request; lockd's 410 marks it lost.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	if err := l.renewOnce(ctx, l.TTL, 0); err != nil {
		return err
	}
	return l.Err()
}

// run renews every renewEvery from when the previous request was sent; a transient failure
// makes the state Unknown and is retried every quarter interval (50..500 ms) until the local
// deadline decides; each request's timeout is capped by the time left before the deadline,
// so a hung lockd cannot delay the loss. With NoRenew it only watches the deadline.
func (l *Lease) run() {
	defer l.wg.Done()
	interval := l.renewEvery
	retry := interval / 4
	if retry < 50*time.Millisecond {
		retry = 50 * time.Millisecond
	}
	if retry > 500*time.Millisecond {
		retry = 500 * time.Millisecond
	}
	l.mu.Lock()
	nextAt := l.deadline.Add(-l.TTL).Add(interval)
	l.mu.Unlock()
	renewing := true
	for {
		l.checkDeadline()
		select {
		case <-l.done:
			return
		case <-l.stop:
			renewing = false
		default:
		}
		deadline := l.Deadline()
		wake := deadline
		if renewing && nextAt.Before(wake) {
			wake = nextAt
		}
		if pause := time.Until(wake); pause > 0 {
			t := time.NewTimer(pause)
			stop := l.stop
			if !renewing {
				stop = nil
			}
			select {
			case <-t.C:
			case <-l.done:
			case <-stop:
			}
			t.Stop()
			continue
		}
		if !renewing {
			continue
		}
		l.renewing.Lock()
		select {
		case <-l.stop:
			l.renewing.Unlock()
			continue
		default:
		}
		sent := time.Now()
		cap := time.Until(deadline)
		if cap < 10*time.Millisecond {
			cap = 10 * time.Millisecond
		}
		err := l.renewOnce(context.Background(), l.TTL, cap)
		l.renewing.Unlock()
		switch {
		case err == nil:
			nextAt = sent.Add(interval)
		case errors.Is(err, ErrLeaseLost):
			return
		default:
			l.mu.Lock()
			if l.state != Lost && l.state != Released {
				l.state = Unknown
			}
			l.mu.Unlock()
			nextAt = time.Now().Add(retry)
		}
	}
}

// StopRenewing stops the background renewal (the lease stays held until its deadline, or
// until Renew); Release does this itself.
func (l *Lease) StopRenewing() { l.stopOnce.Do(func() { close(l.stop) }) }

// Release stops the renewal and releases the lease at lockd. Releasing twice is a no-op. A
// lease lost before is still released at lockd (briefly) and its loss returned; a transient
// error of a live lease is returned (the caller may retry).
func (l *Lease) Release(ctx context.Context) error {
	l.StopRenewing()
	l.renewing.Lock() // wait for a renewal in flight
	l.renewing.Unlock()
	l.checkDeadline()
	l.mu.Lock()
	state, lostErr := l.state, l.err
	l.mu.Unlock()
	if state == Released {
		return nil
	}
	var timeout time.Duration
	if state == Lost {
		timeout = 2 * time.Second
	}
	_, err := l.c.d.do(ctx, "POST", l.r.release, nil, map[string]any{"lease_id": l.LeaseID}, timeout, nil)
	if state == Lost {
		return lostErr
	}
	if errors.Is(err, ErrLeaseLost) {
		l.finish(Lost, err)
		return err
	}
	if err != nil {
		return err
	}
	l.finish(Released, ErrReleased)
	l.wg.Wait()
	return nil
}
