package top

import (
	"container/heap"
	"sort"
)

// Entry is one key of a top list and its count. A sketch's Count may overstate the
// key's true count by at most Err (Space-Saving's guarantee); Err is 0 for counts read
// back from Redis, where the flushed counts are summed.
type Entry struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Err   uint64 `json:"error,omitempty"`
}

// Sketch is a Space-Saving heavy-hitter summary (Metwally, Agrawal, El Abbadi, "Efficient
// Computation of Frequent and Top-k Elements in Data Streams", 2005): at most Cap keys,
// whatever the number of distinct keys fed to it. Any key whose true count exceeds
// total/Cap is in it, and each kept count overstates the truth by at most the count of
// the key it replaced. Not safe for concurrent use (the Tracker locks around it).
//
// Hand-written because no module served here implements it and it is a few dozen lines
// on container/heap: a min-heap by count, and a map from key to heap position.
type Sketch struct {
	cap int
	h   minHeap
	idx map[string]int
}

// NewSketch returns a sketch that keeps at most capacity keys (minimum 1).
func NewSketch(capacity int) *Sketch {
	capacity = max(capacity, 1)
	s := &Sketch{cap: capacity, idx: make(map[string]int, capacity)}
	s.h.idx = s.idx
	return s
}

// Add counts n more for key.
func (s *Sketch) Add(key string, n uint64) {
	if n == 0 {
		return
	}
	if i, ok := s.idx[key]; ok {
		s.h.es[i].Count += n
		heap.Fix(&s.h, i)
		return
	}
	if len(s.h.es) < s.cap {
		heap.Push(&s.h, Entry{Key: key, Count: n})
		return
	}
	// Replace the smallest: the newcomer inherits its count as the error bound.
	min := s.h.es[0]
	delete(s.idx, min.Key)
	s.h.es[0] = Entry{Key: key, Count: min.Count + n, Err: min.Count}
	s.idx[key] = 0
	heap.Fix(&s.h, 0)
}

// Len is the number of keys kept (at most the capacity).
func (s *Sketch) Len() int { return len(s.h.es) }

// Top returns the n largest entries, largest first (all of them when n <= 0).
func (s *Sketch) Top(n int) []Entry {
	out := append([]Entry(nil), s.h.es...)
	Sort(out)
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// Sort orders entries by count, largest first, then by key (a stable answer for ties).
func Sort(es []Entry) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].Count != es[j].Count {
			return es[i].Count > es[j].Count
		}
		return es[i].Key < es[j].Key
	})
}

// minHeap implements heap.Interface over entries, keeping idx (key → position) current.
type minHeap struct {
	es  []Entry
	idx map[string]int
}

func (h *minHeap) Len() int           { return len(h.es) }
func (h *minHeap) Less(i, j int) bool { return h.es[i].Count < h.es[j].Count }
func (h *minHeap) Swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.idx[h.es[i].Key] = i
	h.idx[h.es[j].Key] = j
}
func (h *minHeap) Push(x any) {
	e, ok := x.(Entry)
	if !ok {
		return
	}
	h.idx[e.Key] = len(h.es)
	h.es = append(h.es, e)
}
func (h *minHeap) Pop() any {
	e := h.es[len(h.es)-1]
	h.es = h.es[:len(h.es)-1]
	delete(h.idx, e.Key)
	return e
}
