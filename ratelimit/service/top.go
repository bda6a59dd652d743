package service

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/tollgate-rl/tollgate/ratelimit/top"
	"github.com/tollgate-rl/tollgate/shared/lease"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// counts is what one applied delta tells about its caller key under its rule.
type counts struct {
	refused  uint64 // requests refused: the gateway's 429s, and a strict check denied
	admitted uint64 // permits admitted: out of a lease or outside one, or a strict check taken
	over     uint64 // permits admitted beyond what the bucket held (over-admission)
}

// deltaCounts reads a delta and its result; ok is false for deltas that were not applied
// (refused by the service, or a resent batch answered from its record), which count
// nothing.
func deltaCounts(d *wire.Delta, r *lease.SyncResult, st *wire.State) (c counts, ok bool) {
	if st.Flags&wire.StateRefused != 0 || r.Replay {
		return c, false
	}
	c.refused = uint64(d.Rejected)
	if d.Flags&(wire.FlagStrict|wire.FlagAcquire) != 0 {
		if r.Allowed {
			c.admitted = uint64(d.Over)
		} else {
			c.refused++
		}
	} else {
		c.admitted = uint64(d.Leased) + uint64(d.Over)
	}
	c.over = uint64(max(r.Overshoot, 0))
	return c, true
}

// observeTop feeds an applied batch to the hot-key tracker.
func (s *Service) observeTop(b *wire.Batch, results []lease.SyncResult, states []wire.State) {
	for i := range b.Deltas {
		d := &b.Deltas[i]
		if c, ok := deltaCounts(d, &results[i], &states[i]); ok {
			s.top.Observe(d.Rule, d.Key, c.refused, c.admitted)
		}
	}
}

// handleTop serves GET /v1/top?rule=ID&by=refused|consumed&n=10: the rule's keys with
// the most refusals (default) or consumption over the last minutes, fleet-wide (every
// replica flushes its counts to Redis every few seconds). Keys are hashes (KeyHash)
// unless the service runs with raw keys; "hashed" says which.
func (s *Service) handleTop(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rule := q.Get("rule")
	if rule == "" || len(rule) > 64 {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "rule: a rule id of 1 to 64 bytes is required", Field: "rule"})
		return
	}
	by := top.Refused
	if v := q.Get("by"); v != "" {
		var err error
		if by, err = top.ParseBy(v); err != nil {
			writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error(), Field: "by"})
			return
		}
	}
	n := 10
	if v := q.Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > top.MaxN {
			writeJSON(w, http.StatusBadRequest, errorBody{Error: "n " + strconv.Quote(v) + ": want 1.." + strconv.Itoa(top.MaxN), Field: "n"})
			return
		}
	}
	list, err := s.top.Top(r.Context(), rule, by, n)
	if errors.Is(err, top.ErrN) {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error(), Field: "n"})
		return
	}
	if err != nil {
		s.redisError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}
