package nativehost_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// A full bucket table keeps limiting a synced fleet. Two gateways of two workers send
// 200,000 distinct callers one request each (three times the 65,536 slots of each
// gateway's table, so buckets are evicted all the time), interleaved with 1,000 fresh
// callers sending 40 requests each on a 20/hour rule, spread over both gateways and all
// workers. A bucket a gateway evicts is forgotten there but not at the service, which
// keeps what every gateway reported and reserved: when the caller comes back, the new
// bucket acquires against that. So every fresh caller is admitted at most its limit —
// a healthy fleet over-admits only the refill between a grant and its use (RATIONALE
// §3), less than a permit in the 48 s (virtual) of the run, longer than two lease
// epochs so leases stranded by evictions are reclaimed during it — and every one of the
// 200,000 its first request.
func TestFullTableKeepsLimitingSyncedFleet(t *testing.T) {
	const (
		flood    = 200_000
		fresh    = 1_000
		perFresh = 40
		limit    = 20
		every    = 6 // every sixth request is a fresh caller's
		total    = flood + fresh*perFresh
		stepUs   = 200    // virtual time per request: 48 s in all
		tickUs   = 25_000 // the filter ticks four times per 100 ms interval
	)
	f := newFleet(t, 2, 2, `[{"id":"api","limit":20,"window":"1h"}]`)
	f.tick(100)
	admitted := make([]int, fresh)
	var floodRefused []string
	nextTick := f.now + tickUs
	for i := 0; i < total; i++ {
		f.now += stepUs
		if f.now >= nextTick {
			nextTick += tickUs
			f.tick(0)
		}
		g, w := i%2, (i/2)%2
		probe := i%every == every-1
		var key string
		if probe {
			key = "fresh-" + strconv.Itoa((i/every)%fresh)
		} else {
			key = "flood-" + strconv.Itoa(i/every*(every-1)+i%every)
		}
		s := f.send(g, w, key)
		if !s.Decided {
			t.Fatalf("request %d (%s) still paused after its callouts were answered", i, key)
		}
		if s.Header("x-ratelimit-policy") == "degraded" {
			t.Fatalf("request %d (%s) degraded with the service up", i, key)
		}
		switch {
		case probe && s.Admitted():
			admitted[(i/every)%fresh]++
		case !probe && !s.Admitted() && len(floodRefused) < 10:
			floodRefused = append(floodRefused, fmt.Sprintf("%s: %d", key, s.Status()))
		}
	}
	var over []string
	least := limit
	for i, n := range admitted {
		least = min(least, n)
		if n > limit {
			over = append(over, fmt.Sprintf("fresh-%d: %d (%s)", i, n, f.records("fresh-"+strconv.Itoa(i))))
		}
	}
	if len(over) > 0 {
		t.Errorf("%d of %d fresh callers admitted more than %d: %s", len(over), fresh, limit, strings.Join(over[:min(len(over), 5)], "; "))
	}
	if len(floodRefused) > 0 {
		t.Errorf("callers refused their first request: %s", strings.Join(floodRefused, ", "))
	}
	var evictions, exhausted int64
	for _, h := range f.gws {
		evictions += h.Metric("tollgate.bucket_evictions")
		exhausted += h.Metric("tollgate.cas_retry_exhausted")
		if k := h.Shared().Keys(); k > 1<<16+6 {
			t.Errorf("a gateway's shared data holds %d keys, more than its table's 65,536 slots and 6 fixed keys", k)
		}
	}
	if evictions < flood/2 {
		t.Errorf("%d evictions over two gateways: the tables were not full", evictions)
	}
	if exhausted != 0 {
		t.Errorf("cas_retry_exhausted %d on one thread per gateway", exhausted)
	}
	t.Logf("%d requests over %.0f s: fresh callers admitted %d–%d of %d; evictions %d; service: %d batches, %d deltas, %d reclaimed",
		total, float64(total*stepUs)/1e6, least, limit, perFresh, evictions, f.svc.Batches, f.svc.Deltas, f.svc.Reclaimed)
}
