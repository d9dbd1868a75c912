package lockd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"lockd.dev/lockd"
)

// The tests run against a real lockd (LOCKD_URL) and resource proxy (PROXY_URL, over a table
// "items" written under lock "items/{key}"), which tests/clients starts; without them they skip.
func servers(t *testing.T) (*lockd.Client, string) {
	t.Helper()
	lockdURL, proxyURL := os.Getenv("LOCKD_URL"), os.Getenv("PROXY_URL")
	if lockdURL == "" || proxyURL == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("LOCKD_URL and PROXY_URL are required under CI=true")
		}
		t.Skip("LOCKD_URL / PROXY_URL not set (tests/clients starts the servers)")
	}
	return lockd.New(lockdURL, lockd.Options{Owner: "go-test"}), proxyURL
}

func unique(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "go/" + t.Name() + "/" + hex.EncodeToString(b)
}

func uniqueKey() string {
	n, _ := rand.Int(rand.Reader, big.NewInt(1_000_000_000))
	return strconv.FormatInt(n.Int64()+1, 10)
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAcquireHeldRelease(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	a, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second, Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second})
	var e *lockd.Error
	if !errors.Is(err, lockd.ErrHeld) || !errors.As(err, &e) || e.Status != 409 || e.Problem["owner"] != "a" {
		t.Fatalf("second acquire: want 409 held naming owner a, got %#v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(a.Err(), lockd.ErrReleased) || a.State() != lockd.Released {
		t.Fatalf("after release: %v %v", a.State(), a.Err())
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	b, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Fence <= a.Fence {
		t.Fatalf("fence did not increase: %d then %d", a.Fence, b.Fence)
	}
}

func TestWaitIsGrantedWhenReleased(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	a, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(300 * time.Millisecond); _ = a.Release(ctx) }()
	start := time.Now()
	b, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if waited := time.Since(start); waited < 250*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("waited %v", waited)
	}
	// A wait that runs out is ErrHeld after about the wait.
	start = time.Now()
	_, err = c.Acquire(ctx, name, lockd.AcquireOptions{TTL: time.Second, Wait: 300 * time.Millisecond})
	if !errors.Is(err, lockd.ErrHeld) || time.Since(start) < 290*time.Millisecond {
		t.Fatalf("want ErrHeld after the wait, got %v after %v", err, time.Since(start))
	}
}

// A grant that came late in a wait (here 1 s after the request, with a 1.5 s TTL) could be
// granted anywhere in the wait, so its deadline would be near: it is renewed at once and its
// local deadline is a full TTL from that renewal.
func TestALateGrantIsRenewedAtOnce(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	a, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(time.Second); _ = a.Release(ctx) }()
	ttl := 1500 * time.Millisecond
	b, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: ttl, Wait: 5 * time.Second, NoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if left := time.Until(b.Deadline()); left < ttl-300*time.Millisecond {
		t.Fatalf("only %v left of a %v lease granted late", left, ttl)
	}
}

func TestClientIDRetryGetsTheSameLease(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	opts := lockd.AcquireOptions{TTL: 5 * time.Second, ClientID: "go-retry-" + strings.Repeat("x", 20)}
	a, err := c.Acquire(ctx, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Acquire(ctx, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	if a.LeaseID != b.LeaseID || a.Fence != b.Fence {
		t.Fatalf("a retry with the same client_id got another lease")
	}
	b.StopRenewing()
	_ = a.Release(ctx)
}

// The grant's answer is lost on the way (lockd granted, the client saw the connection drop):
// the retry sends the same client_id and gets that same lease, instead of waiting behind it.
func TestALostGrantIsRecoveredByTheRetry(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	r := newRelay(t, strings.TrimPrefix(c.URL(), "http://"))
	r.mu.Lock()
	r.swallow = 1
	r.mu.Unlock()
	viaRelay := lockd.New("http://"+r.ln.Addr().String(), lockd.Options{})
	name := unique(t)
	l, err := viaRelay.Acquire(ctx, name, lockd.AcquireOptions{TTL: 30 * time.Second, Wait: 3 * time.Second})
	if err != nil {
		t.Fatalf("the retry did not recover the grant: %v", err)
	}
	defer l.Release(ctx)
	st, err := c.Status(ctx, name)
	if err != nil || !st.Held || st.Fence != l.Fence || st.Fence != 1 {
		t.Fatalf("lockd: %+v %v; lease fence %d", st, err, l.Fence)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.swallow != 0 {
		t.Fatal("no answer was dropped")
	}
}

// While lockd cannot be reached the lease is Unknown and renewal is retried; reached again
// before the deadline it is Renewed and live. Unreachable past the deadline, it is lost at
// the deadline (one TTL after the last successful renewal was sent), not later.
func TestRenewalRidesOutAnOutageShorterThanTheTTL(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	r := newRelay(t, strings.TrimPrefix(c.URL(), "http://"))
	viaRelay := lockd.New("http://"+r.ln.Addr().String(), lockd.Options{})
	ttl := 1500 * time.Millisecond
	l, err := viaRelay.Acquire(ctx, unique(t), lockd.AcquireOptions{TTL: ttl, RenewEvery: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	r.setRefuse(true)
	waitFor(t, "state unknown", ttl, func() bool { return l.State() == lockd.Unknown })
	r.setRefuse(false)
	waitFor(t, "renewed again", ttl, func() bool { return l.State() == lockd.Renewed })
	if l.Err() != nil {
		t.Fatal(l.Err())
	}

	r.setRefuse(true)
	<-l.Done()
	late := time.Since(l.Deadline())
	var e *lockd.Error
	if !errors.As(l.Err(), &e) || e.Code != "local_deadline" || !errors.Is(e, lockd.ErrLeaseLost) {
		t.Fatalf("Err %v", l.Err())
	}
	if late < 0 || late > 100*time.Millisecond {
		t.Fatalf("lost %v after the local deadline", late)
	}
}

func TestRenewalKeepsTheLeaseAndLossIsSignalled(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	ttl := 600 * time.Millisecond
	l, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * ttl)
	if l.Err() != nil || l.State() != lockd.Renewed {
		t.Fatalf("renewed lease: state %v err %v", l.State(), l.Err())
	}
	st, err := c.Status(ctx, name)
	if err != nil || !st.Held || st.Fence != l.Fence {
		t.Fatalf("lockd does not hold it: %+v %v", st, err)
	}
	// Without renewal the lease is lost at its local deadline: Done closes, Err says so.
	n, err := c.Acquire(ctx, name+"/n", lockd.AcquireOptions{TTL: ttl, NoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Done():
	case <-time.After(2 * ttl):
		t.Fatal("lost signal did not fire")
	}
	if !time.Now().After(n.Deadline()) || !errors.Is(n.Err(), lockd.ErrLeaseLost) {
		t.Fatalf("lost early or without ErrLeaseLost: %v", n.Err())
	}
	if err := n.Renew(ctx); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Fatalf("renew of a lost lease: %v", err)
	}
	_ = l.Release(ctx)
}

func TestA410AtRenewalIsLostAtOnce(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	l, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 3 * time.Second, RenewEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Another process with the lease id releases it behind the lease's back.
	body := strings.NewReader(`{"lease_id": "` + l.LeaseID + `"}`)
	resp, err := http.Post(c.URL()+"/v1/locks/"+name+"/release", "application/json", body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("release behind its back: %v %v", resp, err)
	}
	resp.Body.Close()
	select {
	case <-l.Done():
	case <-time.After(time.Second):
		t.Fatal("a 410 at renewal did not make the lease lost")
	}
	var e *lockd.Error
	if !errors.As(l.Err(), &e) || e.Status != 410 || !errors.Is(l.Err(), lockd.ErrLeaseLost) {
		t.Fatalf("Err %#v", l.Err())
	}
	if time.Until(l.Deadline()) < time.Second {
		t.Fatal("lost by the deadline, not by the 410")
	}
	if err := l.Release(ctx); !errors.Is(err, lockd.ErrLeaseLost) {
		t.Fatalf("release of a lost lease: %v", err)
	}
}

func TestStaleWriteIsRefusedWithBothFences(t *testing.T) {
	c, proxy := servers(t)
	ctx := context.Background()
	key := uniqueKey()
	lock := "items/" + key
	a, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 400 * time.Millisecond, NoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	wa := lockd.NewFencedWriter(proxy, a, lockd.Options{})
	if _, err := wa.Upsert(ctx, "items", key, lockd.Row{"id": key, "owner": "a", "n": 1}); err != nil {
		t.Fatal(err)
	}
	<-a.Done()
	b, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 5 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	wb := lockd.NewFencedWriter(proxy, b, lockd.Options{})
	if _, err := wb.Upsert(ctx, "items", key, lockd.Row{"id": key, "owner": "b", "n": 2}); err != nil {
		t.Fatal(err)
	}
	_, err = wa.Upsert(ctx, "items", key, lockd.Row{"id": key, "owner": "a", "n": 3})
	var stale *lockd.StaleTokenError
	if !errors.As(err, &stale) || !errors.Is(err, lockd.ErrStaleToken) {
		t.Fatalf("want StaleTokenError, got %v", err)
	}
	if stale.Presented != a.Fence || stale.Highest != b.Fence || stale.Lock != lock {
		t.Fatalf("stale error %+v; fences a=%d b=%d", stale, a.Fence, b.Fence)
	}
	row, err := wb.Get(ctx, "items", key)
	if err != nil || row["owner"] != "b" {
		t.Fatalf("row after the refused write: %v %v", row, err)
	}
	if lockd.KindOf(err) != "" || lockd.KindOf(stale) != "stale_token" {
		t.Fatal("KindOf")
	}
}

func TestSharedLeasesCoexistAndNeverWrite(t *testing.T) {
	c, proxy := servers(t)
	ctx := context.Background()
	key := uniqueKey()
	lock := "items/" + key
	r1, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 5 * time.Second, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 5 * time.Second, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	if !r1.Shared || !r2.Shared {
		t.Fatal("not shared")
	}
	if _, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: time.Second}); !errors.Is(err, lockd.ErrHeld) {
		t.Fatalf("exclusive beside shared: %v", err)
	}
	w := lockd.NewFencedWriter(proxy, r1, lockd.Options{})
	if _, err := w.Upsert(ctx, "items", key, lockd.Row{"id": key, "n": 1}); !errors.Is(err, lockd.ErrSharedToken) {
		t.Fatalf("shared write: %v", err)
	}
	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
}

func TestAcquireManyCarriesEveryFence(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	x, y := unique(t)+"/x", unique(t)+"/y"
	l, err := c.AcquireMany(ctx, []string{x, y}, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Fences) != 2 || l.Fences[x] == 0 || l.Fences[y] == 0 {
		t.Fatalf("fences %v", l.Fences)
	}
	if _, err := c.Acquire(ctx, y, lockd.AcquireOptions{TTL: time.Second}); !errors.Is(err, lockd.ErrHeld) {
		t.Fatalf("a lock of the set: %v", err)
	}
	claims, err := lockd.NewVerifier(c).Verify(ctx, l.Token())
	if err != nil || claims.Locks[x] != l.Fences[x] || claims.Locks[y] != l.Fences[y] {
		t.Fatalf("claims %+v %v", claims, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AcquireMany(ctx, []string{x, x}, lockd.AcquireOptions{TTL: time.Second}); !errors.Is(err, lockd.ErrInvalid) {
		t.Fatalf("duplicate names: %v", err)
	}
}

func TestPermitsUpToTheLimit(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	p1, err := c.AcquirePermit(ctx, name, 2, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := c.AcquirePermit(ctx, name, 2, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if p1.Slot == p2.Slot || p2.Fence <= p1.Fence || p1.Lock != "sem/"+name+"/"+strconv.Itoa(p1.Slot) {
		t.Fatalf("permits %+v %+v", p1, p2)
	}
	if _, err := c.AcquirePermit(ctx, name, 2, lockd.AcquireOptions{TTL: time.Second}); !errors.Is(err, lockd.ErrHeld) {
		t.Fatalf("third permit: %v", err)
	}
	if _, err := c.AcquirePermit(ctx, name, 3, lockd.AcquireOptions{TTL: time.Second}); !errors.Is(err, lockd.ErrLimitMismatch) {
		t.Fatalf("other limit: %v", err)
	}
	_ = p1.Release(ctx)
	p3, err := c.AcquirePermit(ctx, name, 2, lockd.AcquireOptions{TTL: 5 * time.Second, Wait: 2 * time.Second})
	if err != nil || p3.Slot != p1.Slot {
		t.Fatalf("freed slot: %v %v", p3, err)
	}
	_ = p2.Release(ctx)
	_ = p3.Release(ctx)
}

func TestElectionCampaignProclaimObserveResign(t *testing.T) {
	c, _ := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	name := unique(t)
	ld, err := c.Campaign(ctx, name, "v1", lockd.AcquireOptions{TTL: 5 * time.Second, Owner: "leader-a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Campaign(ctx, name, "v2", lockd.AcquireOptions{TTL: time.Second}); !errors.Is(err, lockd.ErrHeld) {
		t.Fatalf("second candidate: %v", err)
	}
	obsCtx, stop := context.WithCancel(ctx)
	events, err := c.Observe(obsCtx, name, "")
	if err != nil {
		t.Fatal(err)
	}
	first := <-events
	if first.Type != "state" || first.Value != "v1" {
		t.Fatalf("first event %+v", first)
	}
	if err := ld.Proclaim(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	var proclaimed lockd.ElectionEvent
	for ev := range events {
		if ev.Type == "proclaim" {
			proclaimed = ev
			break
		}
	}
	if proclaimed.Value != "v2" || proclaimed.Fence != ld.Fence || proclaimed.ID == "" {
		t.Fatalf("proclaim event %+v", proclaimed)
	}
	stop()
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// Resuming after the proclaim event yields what came after it: the resignation.
	resumed, err := c.Observe(ctx, name, proclaimed.ID)
	if err != nil {
		t.Fatal(err)
	}
	for ev := range resumed {
		if ev.Type == "state" {
			continue
		}
		if ev.Type != "resign" {
			t.Fatalf("after resuming from %s: %+v", proclaimed.ID, ev)
		}
		break
	}
	if err := ld.Proclaim(ctx, "v3"); !errors.Is(err, lockd.ErrReleased) && !errors.Is(err, lockd.ErrLeaseLost) {
		t.Fatalf("proclaim after resigning: %v", err)
	}
}

func TestVerifierChecksTokensOffline(t *testing.T) {
	c, _ := servers(t)
	ctx := context.Background()
	name := unique(t)
	l, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	v := lockd.NewVerifier(c)
	claims, err := v.Verify(ctx, l.Token())
	if err != nil || claims.Lock != name || claims.Fence != l.Fence || claims.KeyID == "" {
		t.Fatalf("claims %+v %v", claims, err)
	}
	parts := strings.Split(l.Token(), ".")
	forged := parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2]))
	if _, err := v.Verify(ctx, forged); !errors.Is(err, lockd.ErrInvalidToken) {
		t.Fatalf("forged: %v", err)
	}
	if _, err := v.Verify(ctx, "x.y"); !errors.Is(err, lockd.ErrInvalidToken) {
		t.Fatalf("malformed: %v", err)
	}
}

func TestBadNamesAreRefusedBeforeSending(t *testing.T) {
	c := lockd.New("http://127.0.0.1:1", lockd.Options{})
	for _, name := range []string{"", "a//b", "a/../b", "/a"} {
		if _, err := c.Acquire(context.Background(), name, lockd.AcquireOptions{TTL: time.Second}); !errors.Is(err, lockd.ErrInvalid) {
			t.Fatalf("%q: %v", name, err)
		}
	}
	_, err := c.Acquire(context.Background(), "x", lockd.AcquireOptions{TTL: time.Second})
	if !errors.Is(err, lockd.ErrUnavailable) {
		t.Fatalf("unreachable lockd: %v", err)
	}
}

func TestAReadFencesTheLock(t *testing.T) {
	c, proxy := servers(t)
	ctx := context.Background()
	key := uniqueKey()
	lock := "items/" + key
	// A holds fence n and prepares a write; lockd loses it behind A's back; B takes the lock
	// and only reads: that read claims B's fence, so A's late write is refused.
	a, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 5 * time.Second, NoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(c.URL()+"/v1/locks/"+lock+"/release", "application/json",
		strings.NewReader(`{"lease_id": "`+a.LeaseID+`"}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("release behind its back: %v %v", resp, err)
	}
	resp.Body.Close()
	b, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if _, err := lockd.NewFencedWriter(proxy, b, lockd.Options{}).Get(ctx, "items", key); !errors.Is(err, lockd.ErrNotFound) {
		t.Fatalf("B's read of an absent row: %v", err)
	}
	if a.Err() != nil {
		t.Fatal("A should still believe it holds the lease")
	}
	_, err = lockd.NewFencedWriter(proxy, a, lockd.Options{}).Insert(ctx, "items", lockd.Row{"id": key, "owner": "a"})
	var stale *lockd.StaleTokenError
	if !errors.As(err, &stale) || stale.Presented != a.Fence || stale.Highest != b.Fence {
		t.Fatalf("A's late write: %v", err)
	}
	// The refusal proves a newer grant: A's lease is lost now, not at its deadline.
	if !errors.Is(a.Err(), lockd.ErrLeaseLost) {
		t.Fatalf("A's lease after the stale write: %v", a.Err())
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("Done not closed")
	}
}

func highest(t *testing.T, proxy, lock string) int64 {
	resp, err := http.Get(proxy + "/v1/fences/" + lock)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Highest int64 }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Highest
}

func TestClaimRaisesTheFenceWithoutWriting(t *testing.T) {
	c, proxy := servers(t)
	ctx := context.Background()
	lock := "items/" + uniqueKey()
	l, err := c.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if h := highest(t, proxy, lock); h >= l.Fence {
		t.Fatalf("highest %d before the claim", h)
	}
	if err := lockd.NewFencedWriter(proxy, l, lockd.Options{}).Claim(ctx); err != nil {
		t.Fatal(err)
	}
	if h := highest(t, proxy, lock); h != l.Fence {
		t.Fatalf("highest %d after the claim, fence %d", h, l.Fence)
	}
}

func TestBatchUnderAMultiLockLease(t *testing.T) {
	c, proxy := servers(t)
	ctx := context.Background()
	k1, k2 := uniqueKey(), uniqueKey()
	l, err := c.AcquireMany(ctx, []string{"items/" + k1, "items/" + k2}, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	w := lockd.NewFencedWriter(proxy, l, lockd.Options{})
	if _, err := w.Batch(ctx, []lockd.BatchOp{
		{Op: "upsert", Table: "items", Key: k1, Row: lockd.Row{"id": k1, "n": 1}},
		{Op: "upsert", Table: "items", Key: k2, Row: lockd.Row{"id": k2, "n": 2}},
	}); err != nil {
		t.Fatal(err)
	}
	for key, n := range map[string]float64{k1: 1, k2: 2} {
		row, err := w.Get(ctx, "items", key)
		if err != nil || row["n"] != n {
			t.Fatalf("row %s: %v %v", key, row, err)
		}
	}
	// A row of neither lock is refused, and nothing of the batch is applied.
	k3 := uniqueKey()
	_, err = w.Batch(ctx, []lockd.BatchOp{
		{Op: "update", Table: "items", Key: k1, Row: lockd.Row{"n": 10}},
		{Op: "upsert", Table: "items", Key: k3, Row: lockd.Row{"id": k3, "n": 3}},
	})
	if !errors.Is(err, lockd.ErrLockNotAllowed) {
		t.Fatalf("a row of another lock: %v", err)
	}
	if row, _ := w.Get(ctx, "items", k1); row["n"] != float64(1) {
		t.Fatalf("half-applied batch: %v", row)
	}
}
