package wazerohost

// Reconfiguration and shutdown, each done the way Envoy does it: a new root context
// per worker while the old one drains, and a drain of in-flight requests before the
// root contexts are finished.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Reconfigure applies a new plugin configuration, as Envoy applies an updated filter
// configuration: the configuration is validated in a canary VM first (a refusal
// returns an error and changes nothing); then every worker VM gets a new root context
// (proxy_on_context_create, proxy_on_vm_start, proxy_on_configure with the new
// configuration) that serves new requests, while the old root context finishes:
// once its in-flight requests are done it gets proxy_on_done (and, if that returns
// false, time until proxy_done) and proxy_on_delete.
func (h *Host) Reconfigure(pluginConfig []byte) error {
	h.reconfMu.Lock()
	defer h.reconfMu.Unlock()
	if h.closing.Load() {
		return errors.New("host: reconfigure: host is closed")
	}
	if err := h.canary(pluginConfig); err != nil {
		return fmt.Errorf("host: reconfigure: %w", err)
	}
	var errs []error
	for _, v := range h.vms {
		v.mu.Lock()
		if v.failed != nil {
			v.mu.Unlock()
			errs = append(errs, fmt.Errorf("worker %d: %w", v.index, v.failed))
			continue
		}
		root, err := v.newRoot(pluginConfig)
		if err != nil {
			v.mu.Unlock()
			errs = append(errs, err)
			continue
		}
		old := v.root
		v.root = root
		old.retired = true
		if v.tick.root == old {
			old.tickPeriod = 0
			if root.tickPeriod == 0 {
				v.tick.root, v.tick.period = root, 0
				signal(v.tick.wake)
			}
		}
		if old.streams > 0 {
			old.drained = make(chan struct{})
		}
		drained := old.drained
		v.mu.Unlock()
		h.bg.Add(1)
		go h.retire(v, old, drained)
	}
	h.stats.reconfigures.Add(1)
	if len(errs) > 0 {
		return fmt.Errorf("host: reconfigure: %w", errors.Join(errs...))
	}
	return nil
}

// retire finishes a replaced root context once its streams are done.
func (h *Host) retire(v *vm, old *pctx, drained chan struct{}) {
	defer h.bg.Done()
	if drained != nil {
		select {
		case <-drained:
		case <-time.After(h.cfg.StreamIdleTimeout):
		case <-h.ctx.Done():
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.finishRoot(old, h.cfg.DrainTimeout)
}

// Close shuts the gateway down the way Envoy drains: new requests are refused,
// in-flight ones get DrainTimeout to finish and are then reset; each root context gets
// proxy_on_done (and, if it returned false, up to DrainTimeout to call proxy_done, with
// ticks and callouts still running) and proxy_on_delete; then ticks and callouts stop
// and the runtime is closed.
func (h *Host) Close() error {
	h.closeOnce.Do(func() {
		h.closing.Store(true)
		h.reconfMu.Lock()
		defer h.reconfMu.Unlock()
		h.inflight.wait(h.cfg.DrainTimeout)
		h.streamCancel()
		h.inflight.wait(-1)
		var wg sync.WaitGroup
		for _, v := range h.vms {
			wg.Add(1)
			go func(v *vm) {
				defer wg.Done()
				v.mu.Lock()
				defer v.mu.Unlock()
				if v.failed == nil {
					v.finishRoot(v.root, h.cfg.DrainTimeout)
				}
			}(v)
		}
		wg.Wait()
		h.cancel()
		h.bg.Wait()
		h.client.CloseIdleConnections()
		h.closeErr = h.rt.Close(context.Background())
	})
	return h.closeErr
}

// inflight counts requests in progress so Close can wait for them; unlike a
// WaitGroup it may be incremented while someone waits.
type inflight struct {
	mu   sync.Mutex
	n    int
	zero chan struct{}
}

func (f *inflight) add() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

func (f *inflight) done() {
	f.mu.Lock()
	f.n--
	if f.n == 0 && f.zero != nil {
		close(f.zero)
		f.zero = nil
	}
	f.mu.Unlock()
}

// wait blocks until no request is in progress, or d has passed (d < 0: no limit).
func (f *inflight) wait(d time.Duration) {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return
	}
	if f.zero == nil {
		f.zero = make(chan struct{})
	}
	z := f.zero
	f.mu.Unlock()
	if d < 0 {
		<-z
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-z:
	case <-t.C:
	}
}
