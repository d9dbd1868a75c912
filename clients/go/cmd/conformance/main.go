// Command conformance is the Go client's runner of lockd's conformance scenarios (the JSON
// files of conformance/, format in conformance/README.md): it runs each against a lockd and a
// resource proxy and prints one JSON line per scenario; the exit status is 0 only if every
// scenario passed.
//
//	conformance -lockd URL -proxy URL conformance/scenarios/*.json
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"lockd.dev/lockd"
)

type scenario struct {
	Name  string           `json:"name"`
	Steps []map[string]any `json:"steps"`
}

var (
	whole = regexp.MustCompile(`^\{([A-Za-z0-9_.]+)\}$`)
	part  = regexp.MustCompile(`\{([A-Za-z0-9_.]+)\}`)
)

// substitute replaces {name} placeholders from env: a string that is one placeholder takes
// the value's own type (a fence stays a number), others are formatted into the string.
func substitute(v any, env map[string]any) any {
	switch x := v.(type) {
	case string:
		if m := whole.FindStringSubmatch(x); m != nil {
			if val, ok := env[m[1]]; ok {
				return val
			}
			panic(fmt.Sprintf("unknown placeholder %s", x))
		}
		return part.ReplaceAllStringFunc(x, func(p string) string {
			val, ok := env[p[1:len(p)-1]]
			if !ok {
				panic(fmt.Sprintf("unknown placeholder %s", p))
			}
			return fmt.Sprint(val)
		})
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = substitute(e, env)
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = substitute(e, env)
		}
		return out
	}
	return v
}

// norm makes numbers comparable (JSON numbers are float64; results use int64 and int).
func norm(v any) any {
	switch x := v.(type) {
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = norm(e)
		}
		return out
	}
	return v
}

func matches(expected, actual any) bool {
	expected, actual = norm(expected), norm(actual)
	if em, ok := expected.(map[string]any); ok {
		am, ok := actual.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range em {
			if a, ok := am[k]; !ok || !matches(v, a) {
				return false
			}
		}
		return true
	}
	return fmt.Sprint(expected) == fmt.Sprint(actual)
}

// check is nil when the outcome is the expected one: the error kind named by "error" (none:
// success), then each field (suffixes _gt, _ge, _le compare numbers).
func check(expect map[string]any, result map[string]any, err error) error {
	want, _ := expect["error"].(string)
	got := lockd.KindOf(err)
	if want != got {
		if want == "" {
			want = "success"
		}
		if got == "" {
			got = "success"
		} else {
			got += " (" + err.Error() + ")"
		}
		return fmt.Errorf("expected %s, got %s", want, got)
	}
	for key, value := range expect {
		if key == "error" {
			continue
		}
		cmp := ""
		field := key
		for _, suffix := range []string{"_gt", "_ge", "_le"} {
			if strings.HasSuffix(key, suffix) {
				cmp, field = suffix, strings.TrimSuffix(key, suffix)
			}
		}
		actual, ok := result[field]
		if !ok {
			return fmt.Errorf("expected %s %v, got nothing", key, value)
		}
		if cmp == "" {
			if !matches(value, actual) {
				return fmt.Errorf("expected %s %v, got %v", key, value, actual)
			}
			continue
		}
		a, _ := norm(actual).(float64)
		b, _ := norm(value).(float64)
		if (cmp == "_gt" && !(a > b)) || (cmp == "_ge" && !(a >= b)) || (cmp == "_le" && !(a <= b)) {
			return fmt.Errorf("expected %s %v, got %v", key, value, actual)
		}
	}
	return nil
}

type runner struct {
	c     *lockd.Client
	proxy string
}

type failed struct{ msg string }

func (f failed) Error() string { return f.msg }

func num(step map[string]any, key string) int64 {
	switch v := step[key].(type) {
	case float64:
		return int64(v)
	case int64:
		return v
	case int:
		return int64(v)
	}
	return 0
}

func str(step map[string]any, key string) string {
	switch v := step[key].(type) {
	case string:
		return v
	case float64:
		return fmt.Sprint(int64(v))
	case int64, int:
		return fmt.Sprint(v)
	}
	return ""
}

func (r *runner) run(path string) map[string]any {
	out := map[string]any{"scenario": path, "client": "go", "ok": true}
	raw, err := os.ReadFile(path)
	var sc scenario
	if err == nil {
		err = json.Unmarshal(raw, &sc)
	}
	if err != nil {
		out["ok"], out["failure"] = false, err.Error()
		return out
	}
	out["scenario"] = sc.Name
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	base, _ := rand.Int(rand.Reader, big.NewInt(100_000_000))
	env := map[string]any{"run": "conf/go-" + hex.EncodeToString(b)}
	for i := 1; i < 10; i++ {
		env[fmt.Sprintf("k%d", i)] = base.Int64()*10 + int64(i)
	}
	leases := map[string]*lockd.Lease{}
	defer func() {
		for _, l := range leases {
			_ = l.Release(context.Background())
		}
	}()
	for i, rawStep := range sc.Steps {
		step := substitute(rawStep, env).(map[string]any)
		started := time.Now()
		result, err := r.step(step, leases)
		var f failed
		if errors.As(err, &f) {
			out["ok"], out["failure"] = false, fmt.Sprintf("step %d (%s): %s", i, step["op"], f.msg)
			return out
		}
		if result == nil {
			result = map[string]any{}
		}
		var stale *lockd.StaleTokenError
		if errors.As(err, &stale) {
			result = map[string]any{"lock": stale.Lock, "presented": stale.Presented, "highest": stale.Highest}
		}
		result["elapsed_ms"] = float64(time.Since(started)) / float64(time.Millisecond)
		expect, _ := step["expect"].(map[string]any)
		if cerr := check(expect, result, err); cerr != nil {
			out["ok"], out["failure"] = false, fmt.Sprintf("step %d (%s): %v", i, step["op"], cerr)
			return out
		}
		if step["op"] == "acquire" && err == nil {
			for _, field := range []string{"fence", "slot", "lock"} {
				if v, ok := result[field]; ok {
					env[str(step, "as")+"."+field] = v
				}
			}
		}
	}
	return out
}

func (r *runner) step(step map[string]any, leases map[string]*lockd.Lease) (map[string]any, error) {
	ctx := context.Background()
	opts := lockd.AcquireOptions{TTL: time.Duration(num(step, "ttl_ms")) * time.Millisecond,
		Wait: time.Duration(num(step, "wait_ms")) * time.Millisecond}
	if renew, ok := step["renew"].(bool); ok && !renew {
		opts.NoRenew = true
	}
	opts.Shared, _ = step["shared"].(bool)
	switch op := str(step, "op"); op {
	case "acquire":
		var lease *lockd.Lease
		result := map[string]any{}
		var err error
		switch {
		case step["locks"] != nil:
			var names []string
			for _, n := range step["locks"].([]any) {
				names = append(names, n.(string))
			}
			lease, err = r.c.AcquireMany(ctx, names, opts)
		case step["semaphore"] != nil:
			var p *lockd.Permit
			p, err = r.c.AcquirePermit(ctx, str(step, "semaphore"), int(num(step, "limit")), opts)
			if err == nil {
				lease, result["slot"] = p.Lease, p.Slot
			}
		case step["election"] != nil:
			var ld *lockd.Leadership
			ld, err = r.c.Campaign(ctx, str(step, "election"), str(step, "value"), opts)
			if err == nil {
				lease = ld.Lease
			}
		default:
			lease, err = r.c.Acquire(ctx, str(step, "lock"), opts)
		}
		if err != nil {
			return nil, err
		}
		leases[str(step, "as")] = lease
		result["lock"], result["fence"], result["shared"] = lease.Lock, lease.Fence, lease.Shared
		if step["locks"] != nil {
			result["locks"] = len(lease.Fences)
		}
		return result, nil
	case "renew":
		return nil, leases[str(step, "lease")].Renew(ctx)
	case "release":
		return nil, leases[str(step, "lease")].Release(ctx)
	case "sleep", "freeze":
		time.Sleep(time.Duration(num(step, "ms")) * time.Millisecond)
		return nil, nil
	case "wait_lost":
		l := leases[str(step, "lease")]
		select {
		case <-l.Done():
		case <-time.After(time.Duration(num(step, "within_ms")) * time.Millisecond):
			return nil, failed{fmt.Sprintf("lease %s not lost within %d ms", str(step, "lease"), num(step, "within_ms"))}
		}
		if !errors.Is(l.Err(), lockd.ErrLeaseLost) {
			return nil, failed{fmt.Sprintf("Done closed but Err is %v", l.Err())}
		}
		return map[string]any{"lost": true}, nil
	case "expect_live":
		if err := leases[str(step, "lease")].Err(); err != nil {
			return nil, err
		}
		return map[string]any{"live": true}, nil
	case "status":
		st, err := r.c.Status(ctx, str(step, "lock"))
		if err != nil {
			return nil, err
		}
		return map[string]any{"held": st.Held, "fence": st.Fence, "owner": st.Owner}, nil
	case "write":
		w := lockd.NewFencedWriter(r.proxy, leases[str(step, "lease")], lockd.Options{})
		row, err := w.Upsert(ctx, str(step, "table"), str(step, "key"), step["row"].(map[string]any))
		return map[string]any{"row": row}, err
	case "read":
		resp, err := http.Get(r.proxy + "/v1/tables/" + str(step, "table") + "/rows/" + str(step, "key"))
		if err != nil {
			return nil, failed{err.Error()}
		}
		defer resp.Body.Close()
		var row map[string]any
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&row) != nil {
			return nil, failed{"read: " + resp.Status}
		}
		return map[string]any{"row": row}, nil
	default:
		return nil, failed{fmt.Sprintf("unknown op %q", op)}
	}
}

func main() {
	lockdURL := flag.String("lockd", lockd.DefaultURL, "lockd's URL")
	proxyURL := flag.String("proxy", "http://127.0.0.1:7071", "the resource proxy's URL")
	flag.Parse()
	r := &runner{c: lockd.New(*lockdURL, lockd.Options{Owner: "conformance-go"}), proxy: *proxyURL}
	ok := true
	for _, path := range flag.Args() {
		out := r.run(path)
		ok = ok && out["ok"] == true
		line, _ := json.Marshal(out)
		fmt.Println(string(line))
	}
	if !ok {
		os.Exit(1)
	}
}
