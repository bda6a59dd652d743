package host

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
)

// metric is one stat shared by every VM that defines the same (type, name), as Envoy's
// stats scope returns the same counter for the same name on every worker.
type metric struct {
	typ  uint32
	name string

	mu    sync.Mutex
	value int64 // counter, gauge, or the last recorded histogram value
	count uint64
	sum   uint64
}

// metricRegistry holds the stats of one Host.
type metricRegistry struct {
	mu      sync.Mutex
	metrics map[string]*metric // key: type + "\x00" + name
}

func newMetricRegistry() *metricRegistry {
	return &metricRegistry{metrics: make(map[string]*metric)}
}

func (r *metricRegistry) define(typ uint32, name string) *metric {
	key := string(rune('0'+typ)) + "\x00" + name
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.metrics[key]
	if !ok {
		m = &metric{typ: typ, name: name}
		r.metrics[key] = m
	}
	return m
}

// vmMetrics maps one VM's metric ids to the shared stats. Envoy allocates ids per Wasm
// instance: counters 4, 8, ...; gauges 5, 9, ...; histograms 6, 10, ...
type vmMetrics struct {
	byID map[uint32]*metric
	next [3]uint32
}

func newVMMetrics() *vmMetrics {
	return &vmMetrics{byID: make(map[uint32]*metric), next: [3]uint32{MetricCounter, MetricGauge, MetricHistogram}}
}

func (v *vmMetrics) define(r *metricRegistry, typ uint32, name string) (uint32, Status) {
	if typ > MetricHistogram {
		return 0, StatusBadArgument
	}
	v.next[typ] += metricIDStep
	id := v.next[typ]
	v.byID[id] = r.define(typ, name)
	return id, StatusOK
}

// increment follows Envoy's Context::incrementMetric: counters accept only positive
// deltas, gauges any delta, histograms none.
func (v *vmMetrics) increment(id uint32, delta int64) Status {
	switch id & metricTypeMask {
	case MetricCounter:
		m, ok := v.byID[id]
		if !ok {
			return StatusNotFound
		}
		if delta <= 0 {
			return StatusBadArgument
		}
		m.mu.Lock()
		m.value += delta
		m.mu.Unlock()
		return StatusOK
	case MetricGauge:
		m, ok := v.byID[id]
		if !ok {
			return StatusNotFound
		}
		m.mu.Lock()
		m.value += delta
		m.mu.Unlock()
		return StatusOK
	}
	return StatusBadArgument
}

// record follows Envoy's Context::recordMetric: a counter adds the value, a gauge is
// set to it, a histogram records it.
func (v *vmMetrics) record(id uint32, value uint64) Status {
	m, ok := v.byID[id]
	if !ok {
		return StatusNotFound
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.typ {
	case MetricCounter:
		m.value += int64(value)
	case MetricGauge:
		m.value = int64(value)
	case MetricHistogram:
		m.value = int64(value)
		m.count++
		m.sum += value
	}
	return StatusOK
}

// get follows Envoy's Context::getMetric: histograms cannot be read back.
func (v *vmMetrics) get(id uint32) (uint64, Status) {
	switch id & metricTypeMask {
	case MetricCounter, MetricGauge:
		m, ok := v.byID[id]
		if !ok {
			return 0, StatusNotFound
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return uint64(m.value), StatusOK
	}
	return 0, StatusBadArgument
}

// Metric is a snapshot of one plugin-defined stat.
type Metric struct {
	Type  int    // MetricCounter, MetricGauge or MetricHistogram
	Name  string // as the plugin defined it
	Value int64  // counter or gauge value; for a histogram the last recorded value
	Count uint64 // histogram: number of recorded values
	Sum   uint64 // histogram: sum of recorded values
}

func (r *metricRegistry) snapshot() []Metric {
	r.mu.Lock()
	all := make([]*metric, 0, len(r.metrics))
	for _, m := range r.metrics {
		all = append(all, m)
	}
	r.mu.Unlock()
	out := make([]Metric, 0, len(all))
	for _, m := range all {
		m.mu.Lock()
		out = append(out, Metric{Type: int(m.typ), Name: m.name, Value: m.value, Count: m.count, Sum: m.sum})
		m.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Type < out[j].Type
	})
	return out
}

// PrometheusName turns a stat name into a valid Prometheus metric name: every character
// outside [a-zA-Z0-9_:] becomes '_' (so Envoy-style dotted names read naturally) and a
// leading digit gets a '_' prefix.
func PrometheusName(name string) string {
	var b strings.Builder
	b.Grow(len(name) + 1)
	for i, r := range name {
		ok := r == '_' || r == ':' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if i == 0 && r >= '0' && r <= '9' {
			b.WriteByte('_')
		}
		if ok {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "_"
	}
	return b.String()
}

// writePrometheus writes metrics in the Prometheus text exposition format. Histograms
// are exported as three gauges (last value, _count, _sum): the ABI gives the host raw
// samples but no bucket layout, and the tests only need totals.
func writePrometheus(w io.Writer, metrics []Metric) error {
	for _, m := range metrics {
		name := PrometheusName(m.Name)
		var err error
		switch m.Type {
		case MetricCounter:
			_, err = fmt.Fprintf(w, "# TYPE %s counter\n%s %d\n", name, name, m.Value)
		case MetricGauge:
			_, err = fmt.Fprintf(w, "# TYPE %s gauge\n%s %d\n", name, name, m.Value)
		default:
			_, err = fmt.Fprintf(w, "# TYPE %s gauge\n%s %d\n# TYPE %s_count gauge\n%s_count %d\n# TYPE %s_sum gauge\n%s_sum %d\n",
				name, name, m.Value, name, name, m.Count, name, name, m.Sum)
		}
		if err != nil {
			return fmt.Errorf("write metric %q: %w", m.Name, err)
		}
	}
	return nil
}
