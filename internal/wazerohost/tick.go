package wazerohost

import "time"

// tickState is the timer behind proxy_set_tick_period_milliseconds for one VM. Envoy
// keeps one timer per root context and re-arms it after each proxy_on_tick returns,
// so a slow tick delays the next one instead of piling up; this host does the same.
type tickState struct {
	root   *pctx
	period time.Duration
	wake   chan struct{}
}

// setTick records a new period for root and wakes the VM's tick loop. A period of 0
// disables the timer. A root replaced by Reconfigure cannot take the timer back from
// its successor. The caller holds v.mu.
func (v *vm) setTick(root *pctx, period time.Duration) {
	if root.retired && period > 0 && v.tick.root != root {
		return
	}
	if period == 0 && v.tick.root != nil && v.tick.root != root {
		return
	}
	root.tickPeriod = period
	v.tick.root = root
	v.tick.period = period
	signal(v.tick.wake)
}

// tickLoop delivers proxy_on_tick to the VM's timer root until the host closes.
func (v *vm) tickLoop() {
	defer v.host.bg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false
	arm := func(p time.Duration) {
		if armed && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		armed = p > 0
		if armed {
			timer.Reset(p)
		}
	}
	for {
		select {
		case <-v.host.ctx.Done():
			return
		case <-v.tick.wake:
			v.mu.Lock()
			p := v.tick.period
			v.mu.Unlock()
			arm(p)
		case <-timer.C:
			armed = false
			v.mu.Lock()
			root, p := v.tick.root, v.tick.period
			if root != nil && p > 0 && !root.deleted && v.failed == nil && v.host.ctx.Err() == nil {
				v.host.stats.ticks.Add(1)
				_, _ = v.call(root, v.fns.onTick, uint64(root.id))
				p = v.tick.period // the tick may have changed it
			}
			v.mu.Unlock()
			arm(p)
		}
	}
}
