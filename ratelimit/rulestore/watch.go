package rulestore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Watcher caches the current version in-process. It learns of new versions from the
// pub/sub channel and, while the subscription is down, by polling every PollDown; it
// also polls every PollUp while subscribed, in case a message was lost.
type Watcher struct {
	s        *Redis
	version  atomic.Uint64
	up       atomic.Bool
	set      atomic.Pointer[Set]
	fetchMu  sync.Mutex
	onChange func(uint64)
}

// Poll intervals.
const (
	PollDown = 50 * time.Millisecond
	PollUp   = 2 * time.Second
)

// NewWatcher returns a Watcher; onChange (may be nil) is called, from the watcher's
// goroutine, each time the version grows.
func NewWatcher(s *Redis, onChange func(uint64)) *Watcher {
	return &Watcher{s: s, onChange: onChange}
}

// Version is the newest version this instance knows of.
func (w *Watcher) Version() uint64 { return w.version.Load() }

// Subscribed reports whether the pub/sub subscription is up.
func (w *Watcher) Subscribed() bool { return w.up.Load() }

// Observe raises the cached version to v (e.g. after this instance wrote v).
func (w *Watcher) Observe(v uint64) {
	for {
		cur := w.version.Load()
		if v <= cur {
			return
		}
		if w.version.CompareAndSwap(cur, v) {
			if w.onChange != nil {
				w.onChange(v)
			}
			return
		}
	}
}

// Current returns the current version's body, from the cache when it is current.
func (w *Watcher) Current(ctx context.Context) (*Set, error) {
	v := w.Version()
	if s := w.set.Load(); s != nil && s.Version >= v {
		return s, nil
	}
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	if s := w.set.Load(); s != nil && s.Version >= w.Version() {
		return s, nil
	}
	s, err := w.s.Current(ctx)
	if err != nil {
		return nil, err
	}
	if cur := w.set.Load(); cur != nil && cur.Version > s.Version {
		// Redis lost its data (FLUSHALL, a restart without persistence): keep enforcing
		// what this instance has, which Enforced offers for writing back.
		return cur, nil
	}
	w.Observe(s.Version)
	w.set.Store(s)
	return s, nil
}

// Enforced is the rule set this instance serves (nil before the first one was read).
func (w *Watcher) Enforced() *Set { return w.set.Load() }

// Poll reads the current version from Redis once.
func (w *Watcher) Poll(ctx context.Context) error {
	v, err := w.s.CurrentVersion(ctx)
	if err != nil {
		return err
	}
	w.Observe(v)
	return nil
}

// Run keeps the cache current until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.poller(ctx)
	}()
	w.subscriber(ctx)
	wg.Wait()
}

func (w *Watcher) poller(ctx context.Context) {
	t := time.NewTicker(PollDown)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.up.Load() && time.Since(last) < PollUp {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if w.Poll(pctx) == nil {
			last = time.Now()
		}
		cancel()
	}
}

func (w *Watcher) subscriber(ctx context.Context) {
	for ctx.Err() == nil {
		w.subscribeOnce(ctx)
		w.up.Store(false)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (w *Watcher) subscribeOnce(ctx context.Context) {
	ps := w.s.rdb.Subscribe(ctx, RedisChannel)
	defer ps.Close()
	// ReceiveTimeout waits out its timeout even when ctx ends; closing wakes it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	if _, err := ps.ReceiveTimeout(ctx, time.Second); err != nil {
		return
	}
	w.up.Store(true)
	// Anything published before the subscription took effect.
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = w.Poll(pctx)
	cancel()
	pinged := false
	for ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(ctx, time.Second)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				// Quiet channel: check the connection is alive.
				pinged = true
				if ps.Ping(ctx) != nil {
					return
				}
				continue
			}
			return
		}
		pinged = false
		if m, ok := msg.(*redis.Message); ok {
			if v, err := strconv.ParseUint(m.Payload, 10, 64); err == nil {
				w.Observe(v)
			}
		}
	}
}
