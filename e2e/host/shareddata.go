package host

import "sync"

// SharedData is the key-value store behind proxy_get_shared_data / proxy_set_shared_data,
// shared by all worker VMs of one Host (one Envoy process, one vm_id).
//
// It mirrors proxy-wasm-cpp-host's SharedData: one mutex, one CAS counter for the whole
// store that starts at 1 and skips 0, every successful set stamps the entry with the next
// counter value, a set with cas 0 is unconditional, and a set with a non-zero cas that
// differs from the entry's fails with CasMismatch. A set on a missing key succeeds
// whatever cas it carries (Envoy does not check cas for new keys).
type SharedData struct {
	mu    sync.Mutex
	cas   uint32
	data  map[string]sharedEntry
	bytes int
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

// NewSharedData returns an empty store.
func NewSharedData() *SharedData {
	return &SharedData{cas: 1, data: make(map[string]sharedEntry)}
}

// nextCas returns the current counter value and advances it, skipping 0.
func (s *SharedData) nextCas() uint32 {
	c := s.cas
	s.cas++
	if s.cas == 0 {
		s.cas++
	}
	return c
}

// Get returns a copy of the value under key and its cas; ok is false when the key is
// missing (StatusNotFound).
func (s *SharedData) Get(key string) (value []byte, cas uint32, ok bool) {
	s.mu.Lock()
	e, ok := s.data[key]
	s.mu.Unlock()
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// get appends the value to dst without an intermediate copy (the hot path of
// proxy_get_shared_data).
func (s *SharedData) get(dst []byte, key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[key]
	if !ok {
		return dst, 0, false
	}
	return append(dst, e.value...), e.cas, true
}

// Set stores value under key with Envoy's CAS rules and returns StatusOK or
// StatusCasMismatch.
func (s *SharedData) Set(key string, value []byte, cas uint32) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[key]
	if ok && cas != 0 && cas != e.cas {
		return StatusCasMismatch
	}
	if ok {
		s.bytes -= len(key) + len(e.value)
	}
	v := make([]byte, len(value))
	copy(v, value)
	s.data[key] = sharedEntry{value: v, cas: s.nextCas()}
	s.bytes += len(key) + len(v)
	return StatusOK
}

// Keys reports how many keys the store holds.
func (s *SharedData) Keys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.data)
}

// Bytes reports the sum of key and value lengths, the payload a real host would keep.
func (s *SharedData) Bytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Range calls f for every entry (in no particular order) with copies of the values.
func (s *SharedData) Range(f func(key string, value []byte, cas uint32)) {
	s.mu.Lock()
	entries := make(map[string]sharedEntry, len(s.data))
	for k, e := range s.data {
		entries[k] = e
	}
	s.mu.Unlock()
	for k, e := range entries {
		f(k, append([]byte(nil), e.value...), e.cas)
	}
}
