package lockd

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"time"
)

// Claims are a verified token's claims: Lock and Fence for one lock, Locks for a
// multi-lock token; Mode is "shared" for a shared lease's token ("" or "exclusive" otherwise).
type Claims struct {
	Lock     string           `json:"lock"`
	Fence    int64            `json:"fence"`
	Locks    map[string]int64 `json:"locks"`
	Mode     string           `json:"mode"`
	IssuedAt int64            `json:"iat"`
	Issuer   string           `json:"iss"`
	// KeyID is the kid of the key that signed the token.
	KeyID string `json:"-"`
}

// Verifier checks tokens offline against lockd's public keys (GET /v1/keys, a JWKS of
// Ed25519 keys). A token naming a key it does not have makes it refetch the set (lockd
// rotated), at most once per MinRefetch; the set is also refetched once older than MaxAge,
// so a retired key stops verifying (while lockd cannot be reached, the set it has still
// verifies). Safe for concurrent use.
type Verifier struct {
	// MinRefetch is the least time between two fetches on unknown kids (default 1 s).
	MinRefetch time.Duration
	// MaxAge is the age after which the set is refetched before verifying (default 60 s).
	MaxAge time.Duration

	c       *Client
	mu      sync.Mutex
	keys    map[string]ed25519.PublicKey
	fetched time.Time
}

// NewVerifier returns a verifier of tokens signed by the keys c's lockd publishes.
func NewVerifier(c *Client) *Verifier {
	return &Verifier{c: c, MinRefetch: time.Second, MaxAge: time.Minute}
}

type jwk struct {
	Kty, Crv, X, Kid string
}

// Refresh fetches the key set now.
func (v *Verifier) Refresh(ctx context.Context) error {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if _, err := v.c.d.do(ctx, "GET", "/v1/keys", nil, nil, 0, &set); err != nil {
		return err
	}
	keys := map[string]ed25519.PublicKey{}
	for _, k := range set.Keys {
		raw, err := base64.RawURLEncoding.DecodeString(k.X)
		if k.Kty != "OKP" || k.Crv != "Ed25519" || err != nil || len(raw) != ed25519.PublicKeySize {
			continue
		}
		keys[k.Kid] = ed25519.PublicKey(raw)
	}
	v.mu.Lock()
	v.keys, v.fetched = keys, time.Now()
	v.mu.Unlock()
	return nil
}

func (v *Verifier) key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	v.mu.Lock()
	key, ok := v.keys[kid]
	stale := v.keys == nil || time.Since(v.fetched) > v.MaxAge
	mayFetch := v.keys == nil || time.Since(v.fetched) >= v.MinRefetch
	v.mu.Unlock()
	if ok && !stale {
		return key, nil
	}
	if stale || mayFetch {
		if err := v.Refresh(ctx); err != nil {
			if ok {
				return key, nil // lockd unreachable: the set it has still verifies
			}
			return nil, err
		}
		v.mu.Lock()
		key, ok = v.keys[kid]
		v.mu.Unlock()
	}
	if !ok {
		return nil, &Error{Kind: ErrInvalidToken, Code: "invalid_token",
			Detail: "token signed by unknown key " + kid}
	}
	return key, nil
}

// Verify checks token's signature (EdDSA, its kid in lockd's key set) and returns its
// claims. Errors: ErrInvalidToken (malformed, bad signature, unknown key), ErrUnavailable
// (the key set could not be fetched).
func (v *Verifier) Verify(ctx context.Context, token string) (*Claims, error) {
	bad := func(why string) error {
		return &Error{Kind: ErrInvalidToken, Code: "invalid_token", Detail: "token " + why}
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, bad("is not a compact JWS")
	}
	var header struct {
		Alg, Kid string
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || json.Unmarshal(raw, &header) != nil {
		return nil, bad("header is malformed")
	}
	if header.Alg != "EdDSA" {
		return nil, bad("algorithm is not EdDSA")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, bad("signature is malformed")
	}
	key, err := v.key(ctx, header.Kid)
	if err != nil {
		return nil, err
	}
	if !ed25519.Verify(key, []byte(parts[0]+"."+parts[1]), sig) {
		return nil, bad("signature does not verify")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	var claims Claims
	if err != nil || json.Unmarshal(payload, &claims) != nil {
		return nil, bad("claims are malformed")
	}
	if claims.Lock == "" && len(claims.Locks) == 0 {
		return nil, bad("names no lock")
	}
	claims.KeyID = header.Kid
	return &claims, nil
}
