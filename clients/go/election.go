package lockd

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Leadership is a won campaign: the leader's lease (renewed in the background), which fences
// its writes like a lock named after the election.
type Leadership struct {
	*Lease
	// Election is the election's name.
	Election string
}

// Campaign runs for leader of election name with value, waiting up to opts.Wait for the
// current leader to go. Errors as Acquire's (ErrHeld: someone else leads).
func (c *Client) Campaign(ctx context.Context, name, value string, opts AcquireOptions) (*Leadership, error) {
	path, err := pathOf("/v1/elections/", name)
	if err != nil {
		return nil, err
	}
	r := route{acquire: path + "/campaign", renew: path + "/renew", release: path + "/resign",
		extra: map[string]any{"value": value}, what: fmt.Sprintf("election %q", name)}
	l, body, err := c.acquireBody(ctx, r, opts)
	if err != nil {
		return nil, err
	}
	l.apply(body)
	l.start()
	return &Leadership{Lease: l, Election: name}, nil
}

// Proclaim changes the leader's value (not its fence). ErrLeaseLost if no longer leader.
func (ld *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := ld.Err(); err != nil {
		return err
	}
	path, _ := pathOf("/v1/elections/", ld.Election)
	_, err := ld.c.d.do(ctx, "POST", path+"/proclaim", nil,
		map[string]any{"lease_id": ld.LeaseID, "value": value}, 0, nil)
	return err
}

// Resign gives up the leadership (Release under the election's name).
func (ld *Leadership) Resign(ctx context.Context) error { return ld.Release(ctx) }

// ElectionEvent is one event of an election's stream: Type "state" first (the current
// leader), then "leader", "proclaim", "resign"... in order. ID resumes the stream.
type ElectionEvent struct {
	ID    string
	Type  string
	Owner string
	Value string
	Fence int64
	Data  map[string]any
}

// Observe streams election name's events (Server-Sent Events) into the returned channel
// until ctx ends, then closes it. lastEventID ("" for none) resumes after that event; a
// dropped stream is reopened with the last seen ID as Last-Event-ID, so no event is missed
// or repeated.
func (c *Client) Observe(ctx context.Context, name, lastEventID string) (<-chan ElectionEvent, error) {
	path, err := pathOf("/v1/elections/", name)
	if err != nil {
		return nil, err
	}
	out := make(chan ElectionEvent, 16)
	go func() {
		defer close(out)
		last := lastEventID
		backoff := 100 * time.Millisecond
		for ctx.Err() == nil {
			n, err := c.observeOnce(ctx, path+"/observe", &last, out)
			if n > 0 {
				backoff = 100 * time.Millisecond
			}
			if err != nil && ctx.Err() == nil {
				_ = sleepCtx(ctx, backoff)
				backoff = minDur(backoff*2, 2*time.Second)
			}
		}
	}()
	return out, nil
}

// observeOnce reads one stream until it ends; it returns how many events it passed on.
func (c *Client) observeOnce(ctx context.Context, path string, last *string, out chan<- ElectionEvent) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.d.base+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if *last != "" {
		req.Header.Set("Last-Event-ID", *last)
	}
	if c.d.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.d.opts.APIKey)
	}
	resp, err := c.d.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("observe: %s", resp.Status)
	}
	n := 0
	ev := ElectionEvent{}
	var data strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data.Len() > 0 {
				if ev.Type == "" {
					ev.Type = "message"
				}
				_ = json.Unmarshal([]byte(data.String()), &ev.Data)
				ev.Owner, _ = ev.Data["owner"].(string)
				ev.Value, _ = ev.Data["value"].(string)
				ev.Fence = toInt64(ev.Data["fence"])
				if leader, ok := ev.Data["leader"].(map[string]any); ok && ev.Owner == "" {
					ev.Owner, _ = leader["owner"].(string)
				}
				if ev.ID != "" {
					*last = ev.ID
				}
				select {
				case out <- ev:
					n++
				case <-ctx.Done():
					return n, ctx.Err()
				}
			}
			ev, data = ElectionEvent{}, strings.Builder{}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			ev.ID = value
		case "event":
			ev.Type = value
		case "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(value)
		}
	}
	return n, fmt.Errorf("observe: stream ended: %v", sc.Err())
}
