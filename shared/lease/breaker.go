package lease

// Breaker is the circuit breaker a gateway worker keeps in front of the sync service.
// Closed: every tick syncs. After Failures consecutive failures it opens: no callouts for
// OpenUs, and decisions run degraded. Then one probe is let through (half-open); its
// success closes the breaker, its failure opens it again. Recovery needs no restart.
//
// Only a closed breaker counts as healthy: while half-open the service has not yet
// answered, so decisions stay degraded (and say so) until the probe succeeds.
type Breaker struct {
	Failures  int64 // consecutive failures that open it
	OpenUs    int64 // how long it stays open before a probe
	consec    int64
	openUntil int64
	state     BreakerState
}

// BreakerState is the breaker's state; its value is what the filter's breaker gauge shows.
type BreakerState uint8

const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "closed"
}

// State returns the current state.
func (b *Breaker) State() BreakerState { return b.state }

// OpenUntil is when an open breaker lets its next probe through.
func (b *Breaker) OpenUntil() int64 { return b.openUntil }

// Allow reports whether a callout may be sent at now (moving open → half-open when due).
func (b *Breaker) Allow(now int64) bool {
	if b.state == BreakerOpen {
		if now < b.openUntil {
			return false
		}
		b.state = BreakerHalfOpen
	}
	return true
}

// Healthy is false while decisions must be marked degraded.
func (b *Breaker) Healthy() bool { return b.state == BreakerClosed }

// Success records a successful sync.
func (b *Breaker) Success() {
	b.consec = 0
	b.state = BreakerClosed
}

// Failure records a failed sync at now.
func (b *Breaker) Failure(now int64) {
	b.consec++
	if b.state == BreakerHalfOpen || b.consec >= b.Failures {
		b.state = BreakerOpen
		b.openUntil = now + b.OpenUs
	}
}
