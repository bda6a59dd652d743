package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestClusterFailoverHTTP kills the primary of a slot the gateway's batches touch. While
// no replica is promoted /v1/sync answers 503 within the batch deadline (derived from the
// configured timeouts; the slack is for scheduling, this is a bound and not a speed
// claim), and the same service recovers on its own after the promotion, loading its
// scripts on the promoted replica (whose script cache was flushed) on NOSCRIPT.
func TestClusterFailoverHTTP(t *testing.T) {
	in := start(t, opts{mode: store.Cluster, store: func(c *store.Config) {
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout = 200*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	}})
	bound := in.svc.BatchTimeout() + time.Second
	prefix := uniq("fo")
	batch := func(seq uint64) []byte {
		b := &wire.Batch{Node: "gw", Seq: seq}
		for i := 0; i < 200; i++ {
			d := delta(fmt.Sprint(prefix, "-", i), "api", algo.FixedWindow, 1_000_000, 60_000)
			d.Over = 1
			b.Deltas = append(b.Deltas, d)
		}
		return encode(b)
	}
	in.sync(t, "/v1/sync", mustDecode(t, batch(1)))
	cc := in.st.Client().(*redis.ClusterClient)
	if err := cc.ForEachShard(context.Background(), func(ctx context.Context, c *redis.Client) error { return c.ScriptFlush(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	type result struct {
		at   time.Time
		took time.Duration
		code int
	}
	results := make(chan result, 1000)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for seq := uint64(2); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			code := post(in.http.URL+"/v1/sync", batch(seq))
			results <- result{t0, time.Since(t0), code}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	killed, err := cluster.KillPrimaryForKey(store.KeyPrefix(prefix + "-0"))
	if killed != "" {
		t.Cleanup(func() {
			if err := cluster.Restart(killed); err != nil {
				t.Errorf("restart %s: %v", killed, err)
			}
		})
	}
	if err != nil {
		close(stop)
		<-done
		t.Fatal(err)
	}
	promoted := time.Now()
	var failures int
	recovered := false
	for end := time.Now().Add(15 * time.Second); !recovered && time.Now().Before(end); {
		select {
		case r := <-results:
			switch {
			case r.code == http.StatusOK:
				recovered = r.at.After(promoted)
			case r.code == http.StatusServiceUnavailable:
				failures++
				if r.took > bound {
					t.Errorf("a 503 took %v, more than the batch deadline %v + 1 s", r.took, in.svc.BatchTimeout())
				}
			default:
				t.Errorf("status %d during failover", r.code)
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	close(stop)
	<-done
	if failures == 0 {
		t.Error("no 503 while the primary was down")
	}
	if !recovered {
		t.Fatal("no successful sync within 15 s of the promotion")
	}
}

func mustDecode(t testing.TB, body []byte) *wire.Batch {
	t.Helper()
	var b wire.Batch
	if err := wire.DecodeBatch(body, &b); err != nil {
		t.Fatal(err)
	}
	return &b
}

// post sends a batch and returns the status (0 on a transport error); safe off the test
// goroutine.
func post(url string, body []byte) int {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+syncSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
