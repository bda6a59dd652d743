package plugin

import (
	"slices"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Shaping (a rule's max_delay): a request whose permit comes within the delay is held
// (Pause) until then and let through, instead of refused. Proxy-wasm has no per-stream
// timer: held requests are released by the root context's tick, which runs every
// shapeTickMs while any is held and at its usual period otherwise.

// shapes reports whether the service's refusal of op's acquire is, for a rule with
// max_delay, a wait for the request's slot rather than a refusal: the service refused
// because the bucket has no permit now (a burst's other requests took them, or the
// leases of other gateways hold them), and the permit comes within max_delay. Such a
// request is decided on the gateway like any request whose lease is short: it takes its
// permit ahead of time, behind those taken before it (Plugin.shape), and waits for it.
// Without this, the requests of a burst that wait for the same acquire would all be
// refused — shaping only ever saw the requests that came after the answer. A penalty
// is never shaped (the caller is slowed on purpose), nor a shadow rule (it never waits).
func shapes(op *bucketOp, st *wire.State) bool {
	r := op.a.Rule
	return r.MaxDelayUs > 0 && !op.shadow && st.PenaltyInMs == 0 &&
		st.Flags&wire.StateRefused == 0 && int64(st.RetryInMs)*1000 <= r.MaxDelayUs
}

// shapeTickMs is the tick period while requests are held: a request goes on at most this
// late after its permit's time.
const shapeTickMs = 5

// delay holds the stream's request until releaseUs.
func (s *Stream) delay(releaseUs int64) Action {
	p := s.p
	p.m.inc(p.m.delayed)
	s.releaseUs = releaseUs
	p.delayed = append(p.delayed, s)
	p.setTick(shapeTickMs)
	return Pause
}

// releaseDue lets every held request whose time has come go on.
func (p *Plugin) releaseDue(now int64) {
	kept := p.delayed[:0]
	for _, s := range p.delayed {
		if s.releaseUs > now {
			kept = append(kept, s)
			continue
		}
		s.releaseUs = 0
		if err := p.host.SetEffectiveContext(s.id); err != nil {
			continue // the stream is gone; OnDone will not find it held
		}
		if err := p.host.ResumeRequest(); err != nil {
			p.host.Log(LogError, "tollgate: resume a delayed request: "+err.Error())
		}
	}
	clear(p.delayed[len(kept):])
	p.delayed = kept
	_ = p.host.SetEffectiveContext(p.host.RootID())
}

// forgetDelayed drops a held stream that ended before its release (reset, timeout).
func (p *Plugin) forgetDelayed(s *Stream) {
	if i := slices.Index(p.delayed, s); i >= 0 {
		p.delayed = slices.Delete(p.delayed, i, i+1)
	}
	s.releaseUs = 0
}

// MetricsFlushMs is the tick period without sync: the counters kept in the VM reach the
// host at most this late (metrics.flush). The beat of requests in flight (beatEveryUs)
// is a multiple of it and runs on the tick that reaches it.
const MetricsFlushMs = 250

// baseTickMs is the tick period without held requests: four per sync interval (see
// OnPluginStart); without sync, MetricsFlushMs.
func (p *Plugin) baseTickMs() uint32 {
	if p.cfg.syncEnabled() {
		return uint32(max(p.cfg.Sync.IntervalMs/4, 1))
	}
	return MetricsFlushMs
}

// setTick asks the host for a tick period of ms, only when it differs from the one asked
// last. Envoy restarts the timer on every proxy_set_tick_period_milliseconds call (it
// disables the timer and creates a new one: source/extensions/common/wasm/wasm.cc), so
// a period set again and again faster than it elapses never ticks. Hence the period
// only speeds up from a request's callback (a request held or waiting) and slows down
// only from the tick itself (settleTick): the timer restarts at most once per tick, and
// a held request waits at most one fast tick.
func (p *Plugin) setTick(ms uint32) {
	if ms == p.tickMs {
		return
	}
	p.tickMs = ms
	if err := p.host.SetTickPeriod(ms); err != nil {
		p.host.Log(LogError, "tollgate: set tick period: "+err.Error())
	}
}

// settleTick returns the tick to its base period once nothing is held or waits; only
// OnTick calls it (setTick says why).
func (p *Plugin) settleTick() {
	if len(p.delayed) == 0 && len(p.waiters) == 0 {
		p.setTick(p.baseTickMs())
	}
}
