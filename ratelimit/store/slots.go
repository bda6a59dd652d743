package store

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// slotMap caches which cluster node serves each hash slot, so that a batch is grouped
// per node (one script call carries every slot of its node, see buildScript) and each
// node's calls find the gateway's idempotency record at a fixed slot of that node.
type slotMap struct {
	mu    sync.Mutex
	table *slotTable
	at    time.Time
}

// slotTable is one CLUSTER SLOTS answer: ranges sorted by start.
type slotTable struct {
	ranges []slotRange
	// first maps a node address to the lowest slot it serves.
	first map[string]int
}

type slotRange struct {
	start, end int
	addr       string
}

// slotMapMaxAge bounds how long a slot map is trusted without an error telling
// otherwise (a resharding moves slots without failing anything).
const slotMapMaxAge = 10 * time.Second

func (m *slotMap) get(ctx context.Context, cc *redis.ClusterClient) (*slotTable, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.table != nil && time.Since(m.at) < slotMapMaxAge {
		return m.table, nil
	}
	// CLUSTER SLOTS answers on every Redis 7 release (its replacement, CLUSTER SHARDS,
	// is 7.0 too but announces endpoints by hostname preference) and names the same
	// addresses go-redis dials, which is what the grouping by node needs.
	//lint:ignore SA1019 see above
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		if m.table != nil {
			return m.table, nil // keep the last known map; calls that hit a moved slot fail and retry
		}
		return nil, fmt.Errorf("cluster slots: %w", err)
	}
	t := &slotTable{first: map[string]int{}}
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		addr := s.Nodes[0].Addr
		t.ranges = append(t.ranges, slotRange{start: int(s.Start), end: int(s.End), addr: addr})
		if f, ok := t.first[addr]; !ok || int(s.Start) < f {
			t.first[addr] = int(s.Start)
		}
	}
	sort.Slice(t.ranges, func(i, j int) bool { return t.ranges[i].start < t.ranges[j].start })
	m.table, m.at = t, time.Now()
	return t, nil
}

func (m *slotMap) invalidate() {
	m.mu.Lock()
	m.table = nil
	m.mu.Unlock()
}

// owner returns the address of the node serving slot and the lowest slot that node
// serves ("" and slot itself when no range covers it: the call then goes where go-redis
// routes it, and fails over like any other).
func (t *slotTable) owner(slot int) (string, int) {
	i := sort.Search(len(t.ranges), func(i int) bool { return t.ranges[i].end >= slot })
	if i < len(t.ranges) && t.ranges[i].start <= slot {
		a := t.ranges[i].addr
		return a, t.first[a]
	}
	return "", slot
}
