package store

import (
	"context"
	"sync"
)

// maxCoalesced bounds the script calls of one coalesced pipeline: a burst larger than
// this goes out in several pipelines, one after the other, so that one pipeline's
// replies stay small and no check waits behind an unbounded queue.
const maxCoalesced = 256

// coalescer gathers the script calls of concurrent checks (batches applied without
// idempotency records: strict checks and acquires, one per request of the rate limit
// service or /v1/check) bound for one Redis node into shared pipelines. While a
// pipeline to a node is in flight, the calls that arrive for it wait and go out
// together in the next one: under load a check costs a share of one round trip
// instead of one of its own, and an idle service sends a check at once (no timer, no
// added latency). Each call stays its own script invocation, so Redis runs them one
// after the other exactly as it would separate round trips: coalescing changes how
// many round trips carry them, never what they decide.
type coalescer struct {
	mu    sync.Mutex
	lanes map[string]*lane // by node address ("" on a standalone server)
}

// lane is one node's queue: at most one pipeline in flight.
type lane struct {
	busy  bool
	queue []*waiter
}

// waiter is one batch's calls for a node and where its results go.
type waiter struct {
	ctx   context.Context
	calls []call
	errs  []error
	// wake receives true when the waiter is to send the next pipeline itself, false
	// when another waiter's pipeline has answered its calls.
	wake chan bool
}

// do runs calls on the node addr, in a pipeline shared with the calls of other
// batches queued for the same node, and returns one error per call (results in
// calls[i].res). The waiter that finds the node idle sends the pipeline; when it is
// answered, the first of the waiters queued meanwhile sends the next one with all
// the queued calls (up to maxCoalesced).
func (c *coalescer) do(ctx context.Context, addr string, calls []call, run func(context.Context, []call) []error) []error {
	w := &waiter{ctx: ctx, calls: calls, wake: make(chan bool, 1)}
	c.mu.Lock()
	if c.lanes == nil {
		c.lanes = map[string]*lane{}
	}
	l := c.lanes[addr]
	if l == nil {
		l = &lane{}
		c.lanes[addr] = l
	}
	l.queue = append(l.queue, w)
	if l.busy {
		c.mu.Unlock()
		if lead := <-w.wake; !lead {
			return w.errs
		}
		c.mu.Lock()
	}
	l.busy = true
	batch := take(l)
	c.mu.Unlock()

	flush(w.ctx, batch, run)

	c.mu.Lock()
	var next *waiter
	if len(l.queue) > 0 {
		next = l.queue[0]
	} else {
		l.busy = false
	}
	c.mu.Unlock()
	if next != nil {
		next.wake <- true
	}
	for _, o := range batch {
		if o != w {
			o.wake <- false
		}
	}
	return w.errs
}

// take removes from l's queue the waiters of the next pipeline: at least the first,
// and more while their calls fit in maxCoalesced.
func take(l *lane) []*waiter {
	n, calls := 0, 0
	for n < len(l.queue) && (n == 0 || calls+len(l.queue[n].calls) <= maxCoalesced) {
		calls += len(l.queue[n].calls)
		n++
	}
	batch := make([]*waiter, n)
	copy(batch, l.queue)
	l.queue = append(l.queue[:0], l.queue[n:]...)
	return batch
}

// flush sends the waiters' calls as one pipeline (run) and gives each its results.
// The pipeline runs under the context of the waiter that sends it: every check's
// context carries the same batch timeout, and a check whose caller hung up is
// finished anyway (service.Check), so one waiter's deadline stands for all.
func flush(ctx context.Context, batch []*waiter, run func(context.Context, []call) []error) {
	if len(batch) == 1 {
		batch[0].errs = run(ctx, batch[0].calls)
		return
	}
	var all []call
	for _, w := range batch {
		all = append(all, w.calls...)
	}
	errs := run(ctx, all)
	i := 0
	for _, w := range batch {
		w.errs = errs[i : i+len(w.calls)]
		for j := range w.calls {
			w.calls[j].res = all[i+j].res
		}
		i += len(w.calls)
	}
}
