package nativehost_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/nativehost"
	"github.com/tollgate-rl/tollgate/internal/memservice"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

type diagIndex map[string]string

func (ix diagIndex) record(h *nativehost.Host, key string) (lease.Record, bool) {
	var r lease.Record
	sk, ok := ix[key]
	if !ok {
		h.Shared().Range(func(k string, v []byte, _ uint32) {
			if !strings.HasPrefix(k, "tg:s:") {
				return
			}
			n, m := binary.Uvarint(v)
			if m <= 0 {
				return
			}
			id := string(v[m : m+int(n)])
			if i := strings.LastIndexByte(id, 0x1f); i >= 0 {
				ix[id[i+1:]] = k
			}
		})
		if sk, ok = ix[key]; !ok {
			return r, false
		}
	}
	v, _, ok := h.Shared().Get(sk)
	if !ok {
		return r, false
	}
	n, m := binary.Uvarint(v)
	id := string(v[m : m+int(n)])
	if !strings.HasSuffix(id, "\x1f"+key) {
		delete(ix, key)
		return r, false
	}
	return r, lease.DecodeRecord(v[m+int(n):], &r) == nil
}

func envF(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return def
}

// DIAG=1 go test -run TestDiagSlowKeys -v ./filter/nativehost
func TestDiagSlowKeys(t *testing.T) {
	if os.Getenv("DIAG") == "" {
		t.Skip()
	}
	keys := int(envF("DIAG_KEYS", 10000))
	lat := int64(envF("DIAG_LAT", 20))
	f := &fleet{t: t, now: 1_700_000_000_000_000, svc: memservice.New(lease.SyncConfig{})}
	cfg := []byte(`{"key":{"source":"header","name":"x-api-key"},"retry_jitter_ms":0,
		"sync":{"cluster":"svc","interval_ms":100,"timeout_ms":250,"lease_ttl_ms":` + os.Getenv("DIAG_TTL") + `,"expected_nodes":1},
		"rules":[{"id":"api","algorithm":"token_bucket","limit":1000,"window":"1s"}]}`)
	if os.Getenv("DIAG_TTL") == "" {
		cfg = []byte(strings.Replace(string(cfg), `"lease_ttl_ms":,`, "", 1))
	}
	ixs := []diagIndex{{}, {}}
	for g, w := range []int{1, 2} {
		h, err := nativehost.New(nativehost.Config{Workers: w, PluginConfig: cfg, Clock: func() int64 { return f.now },
			Properties: map[string]string{"node.id": "gw-" + strconv.Itoa(g)}})
		if err != nil {
			t.Fatal(err)
		}
		f.gws = append(f.gws, h)
	}
	type delayed struct {
		g  int
		c  *nativehost.Callout
		at int64
	}
	var queue []delayed
	step := func() {
		f.now += 1000
		if (f.now/1000)%25 == 0 {
			for _, h := range f.gws {
				for w := range h.Workers() {
					h.Tick(w)
				}
			}
		}
		for g, h := range f.gws {
			for _, c := range h.TakeCallouts() {
				queue = append(queue, delayed{g, c, f.now + lat*1000})
			}
		}
		kept := queue[:0]
		for _, d := range queue {
			if d.at <= f.now {
				status, body := f.svc.Handle(d.c.Header(":path"), d.c.Body, f.now)
				f.gws[d.g].Respond(d.c, [][2]string{{":status", strconv.Itoa(status)}}, body)
			} else {
				kept = append(kept, d)
			}
		}
		queue = kept
	}
	for range 5000 {
		step()
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	reasons := map[string]int{}
	total, paused := 0, 0
	m0 := []map[string]int64{f.gws[0].Metrics(), f.gws[1].Metrics()}
	run := func(g int, ms int, perSec float64, count bool) {
		h := f.gws[g]
		rate := perSec / 1000
		for range ms {
			step()
			for x := rnd.ExpFloat64(); x < rate; x += rnd.ExpFloat64() {
				key := "k" + strconv.Itoa(rnd.IntN(keys))
				rec, found := ixs[g].record(h, key)
				s := h.Request(rnd.IntN(len(h.Workers())), [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "a"}, {"x-api-key", key}}, nil)
				if !count {
					continue
				}
				total++
				if !s.Paused {
					continue
				}
				paused++
				var why string
				switch {
				case !found:
					why = "no record"
				case !rec.Synced():
					why = fmt.Sprintf("never synced cold=%d coldcut=%d", rec.Cold, rec.ColdCut)
				case rec.AcquireUntilUs > f.now:
					why = "waits for acquire out"
				case f.now < rec.LeaseUntilUs && rec.LeaseLeft < 1:
					why = fmt.Sprintf("valid dry lease (cut %d, synced %dms ago, until +%dms, coldcut %d)", min(rec.CutSeq, 1), (f.now-rec.SyncedUs)/1000/100*100, (rec.LeaseUntilUs-f.now)/1000/100*100, rec.ColdCut)
				case f.now >= rec.LeaseUntilUs:
					why = fmt.Sprintf("expired: cold %d coldcut %d global %d", rec.Cold, rec.ColdCut, min(rec.GlobalRemaining, 1))
				default:
					why = "other"
				}
				reasons[why]++
			}
		}
	}
	idle := func(ms int) {
		for range ms {
			step()
		}
	}
	sat := envF("DIAG_RATE", 7800)
	run(0, 2000, sat, false)
	run(1, 2000, sat, false)
	for range 3 {
		run(0, 2500, sat, true)
		idle(5000)
		run(1, 2500, sat, true)
		idle(5000)
	}
	for _, fr := range []float64{0.10, 0.25} {
		for range 2 {
			run(1, 3500, 18394*fr, true)
			idle(3000)
		}
	}
	var lines []string
	for k, v := range reasons {
		lines = append(lines, fmt.Sprintf("%6d %s", v, k))
	}
	sort.Strings(lines)
	t.Logf("requests %d, paused %d (%.2f%%)\n%s", total, paused, 100*float64(paused)/float64(total), strings.Join(lines, "\n"))
	for g, h := range f.gws {
		var ms []string
		for k, v := range h.Metrics() {
			if v-m0[g][k] != 0 && !strings.HasPrefix(k, "rule") {
				ms = append(ms, fmt.Sprintf("%s=%d", strings.TrimPrefix(k, "tollgate."), v-m0[g][k]))
			}
		}
		sort.Strings(ms)
		t.Logf("gw%d metrics: %s", g, strings.Join(ms, " "))
	}
}
