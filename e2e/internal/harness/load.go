package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Answer is what one request got back, with the rate-limit headers a scenario checks.
type Answer struct {
	Seq     int
	Gateway int // index into Load.Gateways
	Sent    time.Time
	Latency time.Duration
	Status  int   // 0 when the request failed (Err)
	Err     error // transport failure
	Header  http.Header
	Body    []byte // the body of answers other than 2xx
}

// Get returns a response header (case-insensitive).
func (a *Answer) Get(name string) string {
	if a.Header == nil {
		return ""
	}
	return a.Header.Get(name)
}

// OK reports a 2xx answer.
func (a *Answer) OK() bool { return a.Status/100 == 2 }

// Degraded reports an answer marked as decided without the sync service.
func (a *Answer) Degraded() bool { return a.Get("X-RateLimit-Policy") == "degraded" }

// LimitHeaders reports whether the answer carries the headers every rate-limited answer
// must have: x-ratelimit-limit/remaining/reset and ratelimit-policy, plus ratelimit
// unless degraded (a degraded answer knows no real remaining count).
func (a *Answer) LimitHeaders() bool {
	for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy"} {
		if a.Get(h) == "" {
			return false
		}
	}
	return a.Degraded() || a.Get("RateLimit") != ""
}

// RetryAfter is the Retry-After header in seconds (-1 when absent or not a number).
func (a *Answer) RetryAfter() int {
	v, err := strconv.Atoi(a.Get("Retry-After"))
	if err != nil {
		return -1
	}
	return v
}

// Client sends requests to gateways over real HTTP/1.1 connections.
type Client struct {
	hc *http.Client
}

// NewClient returns a client with enough keep-alive connections for the paced loads.
func NewClient() *Client {
	tr := &http.Transport{
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &Client{hc: &http.Client{Transport: tr, Timeout: 15 * time.Second}}
}

// Close drops idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Get sends GET base+path with the caller key in x-api-key (none when key is "") and
// the extra headers.
func (c *Client) Get(ctx context.Context, base, path, key string, extra ...[2]string) Answer {
	a := Answer{Sent: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		a.Err = err
		return a
	}
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	for _, h := range extra {
		req.Header.Set(h[0], h[1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		a.Err = err
		a.Latency = time.Since(a.Sent)
		return a
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	a.Latency = time.Since(a.Sent)
	a.Status, a.Header = resp.StatusCode, resp.Header
	if err != nil {
		a.Err = fmt.Errorf("read body: %w", err)
	}
	if !a.OK() {
		a.Body = body
	}
	return a
}

// Load is paced traffic for one caller key, spread over gateways by weight.
type Load struct {
	Gateways []*Gateway
	Weights  []int // per gateway; nil: equal
	Path     string
	Key      string
	Header   [][2]string
	Rate     float64       // requests per second, evenly spaced
	Duration time.Duration // how long to send (when Count is 0)
	Count    int           // how many to send (0: for Duration)
	Workers  int           // requests in flight at most (default 32)
	// Stop, when closed, ends the load: no new request is sent, those in flight finish.
	Stop <-chan struct{}
	// OnAnswer, if set, sees every answer as it arrives (from several goroutines).
	OnAnswer func(*Answer)
}

// Run sends the load and returns every answer in send order. Requests are scheduled at
// start + i/Rate; when all workers are busy the schedule slips (Lag reports by how much).
func (c *Client) Run(ctx context.Context, l Load) []Answer {
	if l.Workers <= 0 {
		l.Workers = 32
	}
	pick := newWeighted(len(l.Gateways), l.Weights)
	type job struct {
		seq, gw int
	}
	jobs := make(chan job, l.Workers)
	var mu sync.Mutex
	var out []Answer
	var wg sync.WaitGroup
	for w := 0; w < l.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				a := c.Get(ctx, l.Gateways[j.gw].URL, l.Path, l.Key, l.Header...)
				a.Seq, a.Gateway = j.seq, j.gw
				if l.OnAnswer != nil {
					l.OnAnswer(&a)
				}
				mu.Lock()
				out = append(out, a)
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	interval := time.Duration(float64(time.Second) / l.Rate)
	for i := 0; ; i++ {
		if l.Count > 0 && i >= l.Count {
			break
		}
		at := start.Add(time.Duration(i) * interval)
		if l.Count == 0 && at.Sub(start) >= l.Duration {
			break
		}
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
			case <-l.Stop:
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil || stopped(l.Stop) {
			break
		}
		jobs <- job{seq: i, gw: pick()}
	}
	close(jobs)
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

func stopped(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// newWeighted returns a smooth weighted round robin over n choices (nginx's): every
// choice gets its share, evenly interleaved, with no randomness.
func newWeighted(n int, weights []int) func() int {
	w := make([]int, n)
	total := 0
	for i := range w {
		w[i] = 1
		if i < len(weights) {
			w[i] = weights[i]
		}
		total += w[i]
	}
	cur := make([]int, n)
	return func() int {
		best := 0
		for i := range cur {
			cur[i] += w[i]
			if cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= total
		return best
	}
}

// Tally counts answers by outcome.
type Tally struct {
	Total, OK, Limited, Denied, Unavailable, OtherStatus, Failed, Degraded int
	PerGateway                                                             []GatewayTally
}

// GatewayTally is Tally for one gateway.
type GatewayTally struct {
	Total, OK, Limited, Degraded int
}

// Count tallies answers; gateways is the number of gateways of the load.
func Count(answers []Answer, gateways int) Tally {
	t := Tally{PerGateway: make([]GatewayTally, gateways)}
	for i := range answers {
		a := &answers[i]
		t.Total++
		var g *GatewayTally
		if a.Gateway >= 0 && a.Gateway < gateways {
			g = &t.PerGateway[a.Gateway]
			g.Total++
		}
		if a.Degraded() {
			t.Degraded++
			if g != nil {
				g.Degraded++
			}
		}
		switch {
		case a.Err != nil || a.Status == 0:
			t.Failed++
		case a.OK():
			t.OK++
			if g != nil {
				g.OK++
			}
		case a.Status == http.StatusTooManyRequests:
			t.Limited++
			if g != nil {
				g.Limited++
			}
		case a.Status == http.StatusForbidden:
			t.Denied++
		case a.Status == http.StatusServiceUnavailable:
			t.Unavailable++
		default:
			t.OtherStatus++
		}
	}
	return t
}

// Table formats rows as an aligned text table with a header row.
func Table(header []string, rows [][]string) string {
	width := make([]int, len(header))
	for i, h := range header {
		width[i] = utf8.RuneCountInString(h)
	}
	for _, r := range rows {
		for i, c := range r {
			if i < len(width) && utf8.RuneCountInString(c) > width[i] {
				width[i] = utf8.RuneCountInString(c)
			}
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		for i := range width {
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			if i > 0 {
				b.WriteString("  ")
			}
			b.WriteString(c)
			if i < len(width)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)))
			}
		}
		b.WriteByte('\n')
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

// KV formats label/value pairs as a two-column table.
func KV(pairs ...string) string {
	var rows [][]string
	for i := 0; i+1 < len(pairs); i += 2 {
		rows = append(rows, []string{pairs[i], pairs[i+1]})
	}
	return Table([]string{"measure", "value"}, rows)
}
