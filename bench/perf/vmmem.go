package perf

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/tollgate-rl/tollgate/internal/wazerohost"
)

// VMMemPoint is a worker VM's linear memory after a number of requests.
type VMMemPoint struct {
	Requests int64
	Elapsed  time.Duration
	Bytes    uint32 // the module's linear memory (it only grows: a high-water mark)
}

// VMMemory is the linear memory of one worker VM running the filter (one rule, local
// decisions: the buckets live in shared data, which is the host's memory) while
// requests go over keys distinct callers: after every `every` requests until n, then, if
// soak > 0, once a minute until soak has passed. Wasm memory never shrinks, so a flat
// series means the Go heap inside the module reuses what it has.
func VMMemory(wasm []byte, keys int, n, every int64, soak time.Duration) ([]VMMemPoint, error) {
	h, err := wazerohost.New(wazerohost.Config{Wasm: wasm, Workers: 1, PluginConfig: LocalConfig("token_bucket", 1_000_000), LogLevel: wazerohost.LogWarn})
	if err != nil {
		return nil, fmt.Errorf("vm memory: %w", err)
	}
	defer h.Close()
	size := func() uint32 {
		var b uint32
		h.CallOnVM(0, func(_ context.Context, mod api.Module) { b = mod.Memory().Size() })
		return b
	}
	reqs := make([]*wazerohost.Request, keys)
	for i := range reqs {
		reqs[i] = BenchRequest("vm-" + strconv.Itoa(i))
	}
	start := time.Now()
	out := []VMMemPoint{{Bytes: size()}}
	var done int64
	run := func(m int64) error {
		for range m {
			if _, err := h.Exchange(0, reqs[done%int64(keys)], UpstreamOK); err != nil {
				return fmt.Errorf("vm memory: request %d: %w", done, err)
			}
			done++
		}
		out = append(out, VMMemPoint{Requests: done, Elapsed: time.Since(start), Bytes: size()})
		return nil
	}
	for done < n {
		if err := run(min(every, n-done)); err != nil {
			return out, err
		}
	}
	for soak > 0 && time.Since(start) < soak {
		next := time.Now().Add(time.Minute)
		for time.Now().Before(next) && time.Since(start) < soak {
			if err := run(10_000); err != nil {
				return out, err
			}
			out = out[:len(out)-1] // one point per minute
		}
		out = append(out, VMMemPoint{Requests: done, Elapsed: time.Since(start), Bytes: size()})
	}
	return out, nil
}
