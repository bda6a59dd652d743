// Package shareddata is Envoy's proxy-wasm shared data store (proxy_get_shared_data /
// proxy_set_shared_data) as proxy-wasm-cpp-host implements it (src/shared_data.cc): one
// store per Envoy process and VM id, shared by every worker VM, with one CAS counter for
// the whole store that starts at 1 and skips 0. Every successful set stamps the entry
// with the next counter value; a set with cas 0 is unconditional; a set with a non-zero
// cas that differs from the entry's fails; a set on a missing key succeeds whatever cas
// it carries. The project's wazero host (internal/wazerohost), its native host
// (filter/nativehost) and the filter's allocation tests all keep their shared data here,
// so the filter meets the same rules in each.
package shareddata

import (
	"strings"
	"sync"
)

// Store is one shared-data store. It is safe for concurrent use.
type Store struct {
	mu    sync.Mutex
	cas   uint32
	data  map[string]*entry
	bytes int
}

type entry struct {
	value []byte
	cas   uint32
}

// New returns an empty store.
func New() *Store {
	return &Store{cas: 1, data: make(map[string]*entry)}
}

// nextCas returns the current counter value and advances it, skipping 0.
func (s *Store) nextCas() uint32 {
	c := s.cas
	s.cas++
	if s.cas == 0 {
		s.cas++
	}
	return c
}

// Get returns a copy of the value under key and its cas; ok is false when the key is
// missing.
func (s *Store) Get(key string) (value []byte, cas uint32, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// AppendGet appends the value under key to dst (no intermediate copy).
func (s *Store) AppendGet(dst []byte, key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[key]
	if !ok {
		return dst, 0, false
	}
	return append(dst, e.value...), e.cas, true
}

// Set stores value under key with Envoy's CAS rules; ok is false on a CAS mismatch.
func (s *Store) Set(key string, value []byte, cas uint32) (ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, found := s.data[key]
	if found && cas != 0 && cas != e.cas {
		return false
	}
	if !found {
		// The store keeps the key: copy it, as Envoy does, since the caller may reuse
		// the memory behind key (the filter formats slot keys into one buffer). An
		// existing entry is updated in place: assigning to the map again would replace
		// its key with the caller's.
		e = &entry{}
		s.data[strings.Clone(key)] = e
	} else {
		s.bytes -= len(key) + len(e.value)
	}
	if cap(e.value) < len(value) || e.value == nil {
		e.value = make([]byte, len(value))
	} else {
		e.value = e.value[:len(value)]
	}
	copy(e.value, value)
	e.cas = s.nextCas()
	s.bytes += len(key) + len(e.value)
	return true
}

// Keys reports how many keys the store holds.
func (s *Store) Keys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.data)
}

// Bytes reports the sum of key and value lengths, the payload a real host would keep.
func (s *Store) Bytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Range calls f for every entry (in no particular order) with copies of the values.
func (s *Store) Range(f func(key string, value []byte, cas uint32)) {
	s.mu.Lock()
	entries := make(map[string]entry, len(s.data))
	for k, e := range s.data {
		entries[k] = entry{value: append([]byte(nil), e.value...), cas: e.cas}
	}
	s.mu.Unlock()
	for k, e := range entries {
		f(k, append([]byte(nil), e.value...), e.cas)
	}
}
