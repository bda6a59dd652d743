package plugin

// breaker is the circuit breaker in front of the sync service (one per worker VM, which
// Envoy gives one cluster connection pool of its own anyway). Closed: every tick syncs.
// After `failures` consecutive failures it opens: no callouts for openUs, decisions run
// degraded. Then one probe is let through (half-open); its success closes the breaker, its
// failure opens it again. Recovery needs no restart.
type breaker struct {
	failures  int64 // threshold
	openUs    int64
	consec    int64
	openUntil int64
	state     breakerState
}

type breakerState uint8

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

func (s breakerState) String() string {
	switch s {
	case breakerOpen:
		return "open"
	case breakerHalfOpen:
		return "half-open"
	}
	return "closed"
}

// allow reports whether a callout may be sent now (moving open → half-open when due).
func (b *breaker) allow(now int64) bool {
	switch b.state {
	case breakerOpen:
		if now < b.openUntil {
			return false
		}
		b.state = breakerHalfOpen
		return true
	case breakerHalfOpen:
		return true
	}
	return true
}

// healthy is false while decisions must be marked degraded.
func (b *breaker) healthy() bool { return b.state != breakerOpen }

func (b *breaker) success() {
	b.consec = 0
	b.state = breakerClosed
}

func (b *breaker) failure(now int64) {
	b.consec++
	if b.state == breakerHalfOpen || b.consec >= b.failures {
		b.state = breakerOpen
		b.openUntil = now + b.openUs
	}
}
