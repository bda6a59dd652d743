package plugin

import (
	"encoding/binary"
	"errors"
)

// Shared-data keys of the gateway-wide sync (RATIONALE.md §6).
const (
	// leaderKey names the worker that syncs for the whole Envoy, with its heartbeat.
	leaderKey = "tg:leader"
	// syncKey is the sync stream's state: seq, health, fleet size, the batch in flight.
	syncKey = "tg:sync"
	// urgentKey collects the slots of buckets that want a report at the next sync, from
	// every worker (each appends once per tick; the leader takes them).
	urgentKey = "tg:urgent"
	// batchKey is the encoded batch in flight (resent unchanged until acknowledged): kept
	// apart from syncKey, which every worker reads often.
	batchKey = "tg:batch"
)

// leader is the value of leaderKey.
type leader struct {
	Worker uint32
	Term   uint32
	BeatUs int64 // the leader's last tick (local clock)
}

func (l *leader) append(dst []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, l.Worker)
	dst = binary.LittleEndian.AppendUint32(dst, l.Term)
	return binary.LittleEndian.AppendUint64(dst, uint64(l.BeatUs))
}

func (l *leader) decode(b []byte) bool {
	if len(b) != 16 {
		return false
	}
	l.Worker = binary.LittleEndian.Uint32(b)
	l.Term = binary.LittleEndian.Uint32(b[4:])
	l.BeatUs = int64(binary.LittleEndian.Uint64(b[8:]))
	return true
}

// syncState is the value of syncKey: what the syncing worker knows of the stream and of
// the service, shared so that every worker decides with the same health and fleet size
// and a worker taking over the sync resends the batch in flight unchanged.
type syncState struct {
	Seq      uint64 // seq of the last batch cut
	LastOkUs int64  // last successful reply (local clock)
	SentUs   int64  // when the batch in flight was sent (0: none in flight)
	Failures uint32 // consecutive failed syncs
	// Hard: the last failure was reported by the service or the connection (not a
	// timeout or a reset).
	Hard bool
	// OpenUntilUs: after a failure no sync is sent before this (backoff); the breaker is
	// open while Failures reaches the configured threshold.
	OpenUntilUs int64
	Nodes       uint32 // fleet size from the last reply (0: not known yet)
	// RulesVersion is the newest rule-set version the service reported.
	RulesVersion uint64
	// Unacked: a batch (in batchKey) awaits its reply and is resent unchanged after a
	// failure; false when the last batch was acknowledged or refused.
	Unacked bool
}

const syncStateVersion = 1

var errSyncState = errors.New("malformed sync state")

func (s *syncState) append(dst []byte) []byte {
	dst = append(dst, syncStateVersion)
	var unacked uint64
	if s.Unacked {
		unacked = 1
	}
	if s.Hard {
		unacked |= 2
	}
	for _, v := range [...]uint64{s.Seq, uint64(s.LastOkUs), uint64(s.SentUs), uint64(s.Failures),
		uint64(s.OpenUntilUs), uint64(s.Nodes), s.RulesVersion, unacked} {
		dst = binary.AppendUvarint(dst, v)
	}
	return dst
}

func (s *syncState) decode(b []byte) error {
	if len(b) == 0 || b[0] != syncStateVersion {
		return errSyncState
	}
	var v [8]uint64
	i := 1
	for n := range v {
		x, k := binary.Uvarint(b[i:])
		if k <= 0 {
			return errSyncState
		}
		v[n] = x
		i += k
	}
	if i != len(b) {
		return errSyncState
	}
	*s = syncState{Seq: v[0], LastOkUs: int64(v[1]), SentUs: int64(v[2]), Failures: uint32(v[3]),
		OpenUntilUs: int64(v[4]), Nodes: uint32(v[5]), RulesVersion: v[6], Unacked: v[7]&1 != 0, Hard: v[7]&2 != 0}
	return nil
}

// healthy reports whether decisions may rely on the service at now: the breaker is
// closed (fewer than failures consecutive failed syncs); once the last success is older
// than staleUs, no sync has failed since and none has waited longer than stuckUs for its
// reply; and some worker has synced within deadUs (the syncing worker is alive). Only a
// closed breaker counts: while probing, the service has not answered yet.
func (s *syncState) healthy(now, staleUs, stuckUs, deadUs int64, failures uint32) bool {
	switch {
	case s.LastOkUs == 0:
		return s.Failures == 0 // nothing known yet: no failure either
	case s.Failures >= failures:
		return false
	case now-s.LastOkUs > staleUs && (s.Failures > 0 || (s.SentUs != 0 && now-s.SentUs > stuckUs)):
		return false
	}
	return now-s.LastOkUs <= deadUs
}
