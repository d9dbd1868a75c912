// Command keepalive holds one lease with the client's background renewal and reports, as JSON
// lines on stdout: "acquired"; "held" after -hold (with the renewals so far and whether the
// lease is still live); then, holding on, "lost" when the lease's lost signal (Done) fires,
// with the wall-clock time, so whoever stops lockd can measure how soon the holder knew.
//
//	keepalive -lockd URL -lock NAME -ttl 2s -hold 60s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"lockd.dev/lockd"
)

func emit(event map[string]any) {
	line, _ := json.Marshal(event)
	fmt.Println(string(line))
}

func main() {
	url := flag.String("lockd", lockd.DefaultURL, "lockd's URL")
	name := flag.String("lock", "keepalive", "the lock to hold")
	ttl := flag.Duration("ttl", 2*time.Second, "the lease's TTL")
	hold := flag.Duration("hold", 60*time.Second, "how long to hold before reporting")
	flag.Parse()
	ctx := context.Background()
	c := lockd.New(*url, lockd.Options{Owner: "keepalive"})
	lease, err := c.Acquire(ctx, *name, lockd.AcquireOptions{TTL: *ttl, Wait: 10 * time.Second})
	if err != nil {
		emit(map[string]any{"event": "error", "error": err.Error()})
		os.Exit(1)
	}
	start := time.Now()
	emit(map[string]any{"event": "acquired", "fence": lease.Fence})
	select {
	case <-lease.Done():
		emit(map[string]any{"event": "lost_early", "after_s": time.Since(start).Seconds(),
			"renewals": lease.Renewals(), "error": lease.Err().Error()})
		os.Exit(1)
	case <-time.After(*hold):
	}
	emit(map[string]any{"event": "held", "after_s": time.Since(start).Seconds(),
		"renewals": lease.Renewals(), "live": lease.Err() == nil, "fence": lease.Fence})
	<-lease.Done()
	emit(map[string]any{"event": "lost", "unix_ns": time.Now().UnixNano(),
		"kind": lockd.KindOf(lease.Err()), "error": lease.Err().Error()})
}
