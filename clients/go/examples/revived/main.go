// Command revived shows why fencing tokens exist: a worker holds lock "items/{key}", writes,
// then freezes (a GC pause, SIGSTOP, a swap storm: its renewals stop with it) past its lease.
// Another worker takes the lock and writes. The first one wakes and, not knowing, writes
// again: the resource proxy refuses it with a *lockd.StaleTokenError, so the newer write
// stays. Exit status 0 only if that happened.
//
//	LOCKD_URL=http://127.0.0.1:7070 PROXY_URL=http://127.0.0.1:7071 go run ./examples/revived [key]
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"lockd.dev/lockd"
)

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func main() {
	lockdURL, proxyURL := env("LOCKD_URL", lockd.DefaultURL), env("PROXY_URL", "http://127.0.0.1:7071")
	key := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 10)
	if len(os.Args) > 1 {
		key = os.Args[1]
	}
	if err := run(context.Background(), lockdURL, proxyURL, key); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, lockdURL, proxyURL, key string) error {
	lock := "items/" + key
	ttl := time.Second

	// Worker A acquires and writes.
	a := lockd.New(lockdURL, lockd.Options{Owner: "worker-a"})
	leaseA, err := a.Acquire(ctx, lock, lockd.AcquireOptions{TTL: ttl, Wait: 5 * time.Second})
	if err != nil {
		return err
	}
	writerA := lockd.NewFencedWriter(proxyURL, leaseA, lockd.Options{})
	if _, err := writerA.Upsert(ctx, "items", key, lockd.Row{"id": key, "owner": "worker-a", "n": 1}); err != nil {
		return err
	}
	fmt.Printf("worker-a: fence %d, wrote n=1\n", leaseA.Fence)

	// A freezes: its renewals stop with it, and it sleeps well past its TTL.
	leaseA.StopRenewing()
	fmt.Println("worker-a: frozen")
	frozen := time.Now()

	// Meanwhile lockd expires A's lease; worker B waits for the lock, gets it, writes.
	b := lockd.New(lockdURL, lockd.Options{Owner: "worker-b"})
	leaseB, err := b.Acquire(ctx, lock, lockd.AcquireOptions{TTL: 10 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		return err
	}
	defer leaseB.Release(ctx)
	writerB := lockd.NewFencedWriter(proxyURL, leaseB, lockd.Options{})
	if _, err := writerB.Upsert(ctx, "items", key, lockd.Row{"id": key, "owner": "worker-b", "n": 2}); err != nil {
		return err
	}
	fmt.Printf("worker-b: fence %d, wrote n=2 (%.1f s after worker-a froze)\n",
		leaseB.Fence, time.Since(frozen).Seconds())

	// A wakes and sends the write it had prepared, without looking at its lease first.
	time.Sleep(time.Until(frozen.Add(2 * ttl)))
	_, err = writerA.Upsert(ctx, "items", key, lockd.Row{"id": key, "owner": "worker-a", "n": 3})
	var stale *lockd.StaleTokenError
	if !errors.As(err, &stale) {
		return fmt.Errorf("the revived worker's write was not refused as stale: %v", err)
	}
	fmt.Printf("worker-a: revived; write refused: %v (presented %d, highest %d)\n",
		err, stale.Presented, stale.Highest)
	fmt.Printf("worker-a: lease lost: %v\n", errors.Is(leaseA.Err(), lockd.ErrLeaseLost))

	row, err := writerB.Get(ctx, "items", key)
	if err != nil {
		return err
	}
	if fmt.Sprint(row["owner"]) != "worker-b" {
		return fmt.Errorf("the row is %v, not worker-b's", row)
	}
	fmt.Printf("row %s: owner %v, n %v\n", key, row["owner"], row["n"])
	return nil
}
