package lockd_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"lockd.dev/lockd"
)

func kidOf(t *testing.T, token string) string {
	raw, err := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[0])
	if err != nil {
		t.Fatal(err)
	}
	var header struct{ Kid string }
	if err := json.Unmarshal(raw, &header); err != nil {
		t.Fatal(err)
	}
	return header.Kid
}

// A verifier that fetched lockd's keys before a rotation verifies the tokens of the new key:
// a token naming a kid it lacks makes it fetch the set again. Needs a lockd of its own
// (ROTATE_LOCKD_URL, with a short LOCKD_KEY_RELOAD_MS), its key directory and the lockd
// command (ROTATE_KEY_DIR, LOCKD_BIN); tests/clients provides them.
func TestVerifierFollowsKeyRotation(t *testing.T) {
	url, dir, bin := os.Getenv("ROTATE_LOCKD_URL"), os.Getenv("ROTATE_KEY_DIR"), os.Getenv("LOCKD_BIN")
	if url == "" || dir == "" || bin == "" {
		t.Skip("ROTATE_LOCKD_URL / ROTATE_KEY_DIR / LOCKD_BIN not set")
	}
	ctx := context.Background()
	c := lockd.New(url, lockd.Options{})
	name := unique(t)
	first, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_ = first.Release(ctx)
	v := lockd.NewVerifier(c)
	v.MinRefetch = 50 * time.Millisecond
	if _, err := v.Verify(ctx, first.Token()); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "keys", "rotate", "--key-dir", dir, "--publish-delay-ms", "300").CombinedOutput()
	if err != nil {
		t.Fatalf("lockd keys rotate: %v: %s", err, out)
	}
	var rotated *lockd.Lease
	waitFor(t, "a token signed by the new key", 10*time.Second, func() bool {
		l, err := c.Acquire(ctx, name, lockd.AcquireOptions{TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(ctx)
		rotated = l
		return kidOf(t, l.Token()) != kidOf(t, first.Token())
	})
	claims, err := v.Verify(ctx, rotated.Token())
	if err != nil {
		t.Fatalf("the new key's token: %v", err)
	}
	if claims.KeyID == kidOf(t, first.Token()) || claims.Fence != rotated.Fence {
		t.Fatalf("claims %+v", claims)
	}
	if _, err := v.Verify(ctx, first.Token()); err != nil {
		t.Fatalf("the old key's token (still published): %v", err)
	}
}
