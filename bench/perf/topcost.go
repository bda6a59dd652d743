package perf

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/internal/ingestgen"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// TopCost is the Redis work per delta of the hot-key lists (package ratelimit/top): the
// same batches posted to /v1/sync with the top-key counts flushed every FlushEvery
// batches, and with them never flushed, in alternating rounds of one run.
type TopCost struct {
	FlushEvery int   // batches of IngestBatch deltas between two flushes
	Deltas     int64 // deltas posted in each of the two arms
	// ScriptUsecPerDelta is the lease scripts' Redis time per delta (EVALSHA, INFO
	// commandstats), in the arm without flushes.
	ScriptUsecPerDelta float64
	// TopUsecPerDelta is the flushes' Redis time per delta (ZINCRBY, ZREMRANGEBYRANK,
	// EXPIRE) in the arm with flushes, less the same commands' time in the arm without
	// (scripts' inner commands also appear in INFO commandstats).
	TopUsecPerDelta float64
	// PlainCPUPerDelta and WithTopCPUPerDelta are Redis process CPU (used_cpu_sys +
	// used_cpu_user) per delta in µs, without and with flushes.
	PlainCPUPerDelta, WithTopCPUPerDelta float64
	// MaxEntries is the most keys the service held in process before a flush.
	MaxEntries int
}

// Ratio is the flushes' Redis time as a share of the lease scripts'.
func (c TopCost) Ratio() float64 {
	if c.ScriptUsecPerDelta == 0 {
		return 0
	}
	return c.TopUsecPerDelta / c.ScriptUsecPerDelta
}

// MeasureTopCost starts a service on the standalone Redis at addr (its own flushing
// timer off, so only this measurement flushes) and posts rounds × 2 arms × perRound
// batches of IngestBatch deltas over IngestKeys keys, one batch at a time. A flush
// every FlushEvery batches stands for a replica taking FlushEvery × IngestBatch deltas
// per flush interval: at the default 5 s interval, flushEvery 1 is 200 deltas a second.
func MeasureTopCost(addr string, flushEvery, rounds, perRound int) (TopCost, error) {
	c := TopCost{FlushEvery: flushEvery}
	svc, err := StartServiceWith(store.Standalone, []string{addr}, func(cfg *service.Config) { cfg.Top.Flush = time.Hour })
	if err != nil {
		return c, err
	}
	defer svc.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	g := ingestgen.New(fmt.Sprintf("top%d", time.Now().UnixNano()%1e9), uint64(time.Now().UnixMicro()))
	rng := rand.New(rand.NewPCG(11, uint64(time.Now().UnixNano())))
	tr := svc.Svc.Top()
	var plain, withTop RedisWork
	add := func(dst *RedisWork, w RedisWork) {
		if dst.Usec == nil {
			dst.Usec, dst.Calls = map[string]int64{}, map[string]int64{}
		}
		for k, v := range w.Usec {
			dst.Usec[k] += v
		}
		for k, v := range w.Calls {
			dst.Calls[k] += v
		}
		dst.CPU += w.CPU
	}
	for range rounds {
		for _, flush := range []bool{false, true} {
			// Counts left from the other arm go to Redis outside the measured window.
			if err := tr.Flush(ctx); err != nil {
				return c, err
			}
			before, err := ReadInfo(ctx, rdb)
			if err != nil {
				return c, err
			}
			for i := 1; i <= perRound; i++ {
				if err := postSync(client, svc.URL, g.Batch(rng)); err != nil {
					return c, err
				}
				if flush && i%flushEvery == 0 {
					c.MaxEntries = max(c.MaxEntries, tr.Entries())
					if err := tr.Flush(ctx); err != nil {
						return c, err
					}
				}
			}
			after, err := ReadInfo(ctx, rdb)
			if err != nil {
				return c, err
			}
			if flush {
				add(&withTop, after.Since(before))
			} else {
				add(&plain, after.Since(before))
			}
		}
	}
	c.Deltas = int64(rounds * perRound * IngestBatch)
	d := float64(c.Deltas)
	sum := func(w RedisWork, cmds ...string) (n int64) {
		for _, k := range cmds {
			n += w.Usec[k]
		}
		return n
	}
	c.ScriptUsecPerDelta = float64(sum(plain, "evalsha", "eval")) / d
	topCmds := []string{"zincrby", "zremrangebyrank", "expire"}
	c.TopUsecPerDelta = float64(sum(withTop, topCmds...)-sum(plain, topCmds...)) / d
	c.PlainCPUPerDelta = plain.CPU * 1e6 / d
	c.WithTopCPUPerDelta = withTop.CPU * 1e6 / d
	return c, nil
}
