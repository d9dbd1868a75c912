package lockd_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"lockd.dev/lockd"
)

// relay forwards TCP connections to target until cut() closes every open one (a dropped
// network path: lockd itself keeps running).
type relay struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	// swallow is how many more connections get their answer dropped: the request reaches
	// lockd, the first bytes of its answer are thrown away and the connection is closed.
	swallow int
	// refuse closes every new connection at once (lockd unreachable) while true.
	refuse bool
}

func (r *relay) setRefuse(on bool) {
	r.mu.Lock()
	r.refuse = on
	r.mu.Unlock()
	if on {
		r.cut()
	}
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			refused := r.refuse
			r.mu.Unlock()
			if refused {
				client.Close()
				continue
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, client, server)
			swallow := r.swallow > 0
			if swallow {
				r.swallow--
			}
			r.mu.Unlock()
			go func() { _, _ = io.Copy(server, client); server.Close() }()
			if swallow {
				go func() {
					_, _ = server.Read(make([]byte, 1))
					client.Close()
					server.Close()
				}()
				continue
			}
			go func() { _, _ = io.Copy(client, server); client.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); r.cut() })
	return r
}

func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

func next(t *testing.T, events <-chan lockd.ElectionEvent, skipState bool) lockd.ElectionEvent {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if skipState && ev.Type == "state" {
				continue
			}
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10 s")
		}
	}
}

// A dropped stream is reopened with Last-Event-ID: the changes made while it was down arrive
// once, in order, and none is repeated.
func TestObserveResumesAfterADroppedStream(t *testing.T) {
	c, _ := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newRelay(t, strings.TrimPrefix(c.URL(), "http://"))
	viaRelay := lockd.New("http://"+r.ln.Addr().String(), lockd.Options{})
	name := unique(t)
	leader, err := c.Campaign(ctx, name, "v1", lockd.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Resign(ctx)
	events, err := viaRelay.Observe(ctx, name, "")
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, events, false); ev.Type != "state" || ev.Value != "v1" {
		t.Fatalf("first event %+v", ev)
	}
	if err := leader.Proclaim(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, events, true); ev.Type != "proclaim" || ev.Value != "v2" {
		t.Fatalf("before the drop: %+v", ev)
	}
	r.cut()
	for _, v := range []string{"v3", "v4"} {
		if err := leader.Proclaim(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"v3", "v4"} {
		if ev := next(t, events, true); ev.Type != "proclaim" || ev.Value != want {
			t.Fatalf("after the drop: want %s, got %+v", want, ev)
		}
	}
}
