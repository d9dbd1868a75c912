package lockd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Error kinds: compare with errors.Is(err, lockd.ErrHeld) and so on. Each names a problem
// code of lockd's or the proxy's HTTP contract (or a family of them).
var (
	// ErrHeld: the lock (or permit, or leadership) was not granted within the wait (409 held).
	ErrHeld = errors.New("held")
	// ErrLeaseLost: the lease is not live any more (410 lease_lost, or the local deadline passed).
	ErrLeaseLost = errors.New("lease_lost")
	// ErrStaleToken: the proxy saw a higher fence for the lock (409 stale_token).
	ErrStaleToken = errors.New("stale_token")
	// ErrTokenRequired: a write without a Fencing-Token (428 token_required).
	ErrTokenRequired = errors.New("token_required")
	// ErrInvalidToken: a token with a bad signature, an unknown key or malformed (401 invalid_token).
	ErrInvalidToken = errors.New("invalid_token")
	// ErrLockNotAllowed: the proxy's policy does not let that lock write that row (403).
	ErrLockNotAllowed = errors.New("lock_not_allowed")
	// ErrSharedToken: a write with a shared lease's token (403 shared_token): shared leases only read.
	ErrSharedToken = errors.New("shared_token")
	// ErrLimitMismatch: a semaphore asked with another limit than its held permits' (409).
	ErrLimitMismatch = errors.New("limit_mismatch")
	// ErrNoLeader: the election has no leader (404 no_leader).
	ErrNoLeader = errors.New("no_leader")
	// ErrForbidden: the API key is missing, unknown or outside its scope (401, 403).
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound: no such table, row or object (404).
	ErrNotFound = errors.New("not_found")
	// ErrInvalid: the request was refused as malformed (422, 413) or an argument is bad
	// (then nothing was sent).
	ErrInvalid = errors.New("invalid_request")
	// ErrLimitExceeded: too many leases or waiters for this identity (429); see Error.RetryAfter.
	ErrLimitExceeded = errors.New("limit_exceeded")
	// ErrUnavailable: the server did not answer or answered 5xx (transient: retrying may help).
	ErrUnavailable = errors.New("unavailable")
	// ErrOutcomeUnknown: a write may or may not have committed; retry with the same
	// Idempotency-Key.
	ErrOutcomeUnknown = errors.New("outcome_unknown")
	// ErrProtocol: an answer that does not follow the contract.
	ErrProtocol = errors.New("protocol_error")
)

var byCode = map[string]error{
	"held": ErrHeld, "lease_lost": ErrLeaseLost, "local_deadline": ErrLeaseLost,
	"stale_token": ErrStaleToken, "token_required": ErrTokenRequired,
	"invalid_token": ErrInvalidToken, "lock_not_allowed": ErrLockNotAllowed,
	"shared_token": ErrSharedToken, "limit_mismatch": ErrLimitMismatch,
	"no_leader": ErrNoLeader, "unauthorized": ErrForbidden, "forbidden": ErrForbidden,
	"forbidden_lock": ErrForbidden, "forbidden_table": ErrForbidden,
	"not_found": ErrNotFound, "invalid_request": ErrInvalid, "payload_too_large": ErrInvalid,
	"idempotency_key_reused": ErrInvalid, "store_unavailable": ErrUnavailable,
	"database_unavailable": ErrUnavailable, "lockd_unreachable": ErrUnavailable,
	"shutting_down": ErrUnavailable, "outcome_unknown": ErrOutcomeUnknown,
	"too_many_leases": ErrLimitExceeded, "too_many_waiters": ErrLimitExceeded,
}

var byStatus = map[int]error{
	401: ErrForbidden, 403: ErrForbidden, 404: ErrNotFound, 410: ErrLeaseLost,
	413: ErrInvalid, 422: ErrInvalid, 428: ErrTokenRequired, 429: ErrLimitExceeded,
	502: ErrUnavailable, 503: ErrUnavailable, 504: ErrUnavailable,
}

// Error is every failed request's error (and a lease's loss): Kind is one of the Err*
// values above, which errors.Is matches; Status and Code are the HTTP status and problem
// code (0 and "" when there was no answer); Problem is the problem-details body.
type Error struct {
	Kind       error
	Status     int
	Code       string
	Detail     string
	Lock       string
	RetryAfter time.Duration
	Problem    map[string]any
}

// Error renders the kind, status and detail.
func (e *Error) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("lockd: %s: %s", e.Kind, e.Detail)
	}
	return fmt.Sprintf("lockd: %s (%d): %s", e.Kind, e.Status, e.Detail)
}

// Unwrap returns Kind, so errors.Is(err, lockd.ErrHeld) works.
func (e *Error) Unwrap() error { return e.Kind }

// StaleTokenError is a write refused because the proxy has seen a higher fence for Lock:
// the holder that sent it was superseded. errors.Is(err, ErrStaleToken) holds for it.
type StaleTokenError struct {
	Lock      string
	Presented int64
	Highest   int64
	Err       *Error
}

// Error names the lock and both fences.
func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("lockd: stale token for lock %q: presented fence %d, highest %d",
		e.Lock, e.Presented, e.Highest)
}

// Unwrap returns the request's *Error (whose Kind is ErrStaleToken).
func (e *StaleTokenError) Unwrap() error { return e.Err }

// KindOf is the short name of err's kind ("held", "lease_lost", "stale_token", ...; the
// problem codes of the HTTP contract), "" for nil and "error" for an error of no known kind.
func KindOf(err error) string {
	if err == nil {
		return ""
	}
	for _, kind := range []error{ErrHeld, ErrLeaseLost, ErrStaleToken, ErrTokenRequired,
		ErrInvalidToken, ErrLockNotAllowed, ErrSharedToken, ErrLimitMismatch, ErrNoLeader,
		ErrForbidden, ErrNotFound, ErrInvalid, ErrLimitExceeded, ErrUnavailable,
		ErrOutcomeUnknown, ErrProtocol} {
		if errors.Is(err, kind) {
			return kind.Error()
		}
	}
	return "error"
}

func invalid(format string, args ...any) error {
	return &Error{Kind: ErrInvalid, Detail: fmt.Sprintf(format, args...)}
}

func unavailable(what string, err error) error {
	return &Error{Kind: ErrUnavailable, Detail: fmt.Sprintf("%s: %v", what, err)}
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case float64:
		return int64(n)
	case json.Number:
		i, _ := n.Int64()
		return i
	}
	return 0
}

// errorFromResponse is the typed error of a non-2xx answer: by problem code first, then by
// status; an unmapped 5xx is ErrUnavailable, any other ErrProtocol.
func errorFromResponse(resp *http.Response, body []byte) error {
	problem := map[string]any{}
	_ = json.Unmarshal(body, &problem)
	code, _ := problem["code"].(string)
	detail, _ := problem["detail"].(string)
	if detail == "" {
		detail, _ = problem["title"].(string)
	}
	if detail == "" {
		detail = http.StatusText(resp.StatusCode)
	}
	kind := byCode[code]
	if kind == nil {
		kind = byStatus[resp.StatusCode]
	}
	if kind == nil {
		kind = ErrProtocol
		if resp.StatusCode >= 500 {
			kind = ErrUnavailable
		}
	}
	if kind == ErrHeld && resp.StatusCode != 409 {
		kind = ErrProtocol
	}
	e := &Error{Kind: kind, Status: resp.StatusCode, Code: code, Detail: detail, Problem: problem}
	e.Lock, _ = problem["lock"].(string)
	if s, err := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64); err == nil {
		e.RetryAfter = time.Duration(s * float64(time.Second))
	}
	if kind == ErrStaleToken {
		stale := &StaleTokenError{Lock: e.Lock, Presented: toInt64(problem["presented"]),
			Highest: toInt64(problem["highest"]), Err: e}
		// A multi-lock write names every stale lock in "stale": report the first.
		if list, ok := problem["stale"].([]any); ok && len(list) > 0 && stale.Lock == "" {
			if first, ok := list[0].(map[string]any); ok {
				stale.Lock, _ = first["lock"].(string)
				stale.Presented, stale.Highest = toInt64(first["presented"]), toInt64(first["highest"])
			}
		}
		return stale
	}
	return e
}
