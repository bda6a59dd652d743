package wazerohost

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
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
	// buckets counts a histogram's values per bound of HistogramBuckets (not
	// cumulative; the last counts values above every bound).
	buckets []uint64
}

// HistogramBuckets are Envoy's default histogram bucket bounds
// (stats_config.histogram_bucket_settings unset): a plugin records raw values and the
// proxy sorts them into these.
var HistogramBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

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
		if m.buckets == nil {
			m.buckets = make([]uint64, len(HistogramBuckets)+1)
		}
		i := sort.SearchFloat64s(HistogramBuckets, float64(value)) // first bound >= value
		m.buckets[i]++
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
	// Buckets: a histogram's cumulative counts per bound of HistogramBuckets.
	Buckets []uint64
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
		x := Metric{Type: int(m.typ), Name: m.name, Value: m.value, Count: m.count, Sum: m.sum}
		if m.typ == MetricHistogram {
			x.Buckets = make([]uint64, len(HistogramBuckets))
			var cum uint64
			for i := range HistogramBuckets {
				if m.buckets != nil {
					cum += m.buckets[i]
				}
				x.Buckets[i] = cum
			}
		}
		m.mu.Unlock()
		out = append(out, x)
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

// StatsTag is one of Envoy's stats_config.stats_tags: where Regex matches a stat's
// name, its second capture group becomes the value of the tag Name and its first is
// cut from the name. Istio's extraStatTags generate such tags.
type StatsTag struct {
	Name  string
	Regex string
}

// DefaultStatsTags are the tags the gateway applies, as envoy.yaml configures Envoy
// for Tollgate (and Istio's extraStatTags ["rule"] does): the rule of a per-rule stat.
var DefaultStatsTags = []StatsTag{{Name: "rule", Regex: `(rule=\.=(.+?);\.;)`}}

type tagExtractor struct {
	name string
	re   *regexp.Regexp
}

func compileTags(tags []StatsTag) ([]tagExtractor, error) {
	out := make([]tagExtractor, 0, len(tags))
	for _, t := range tags {
		re, err := regexp.Compile(t.Regex)
		if err != nil {
			return nil, fmt.Errorf("stats tag %q: %w", t.Name, err)
		}
		if re.NumSubexp() < 2 {
			return nil, fmt.Errorf("stats tag %q: regex %q needs two capture groups (what to cut, the value)", t.Name, t.Regex)
		}
		out = append(out, tagExtractor{name: t.Name, re: re})
	}
	return out, nil
}

// extractTags applies tags to a stat name as Envoy's tag extractors do, in order, each
// on what the previous left: the tag-extracted name and the tags found.
func extractTags(tags []tagExtractor, name string) (string, map[string]string) {
	var found map[string]string
	for _, t := range tags {
		m := t.re.FindStringSubmatchIndex(name)
		if m == nil || m[2] < 0 || m[4] < 0 {
			continue
		}
		if found == nil {
			found = map[string]string{}
		}
		found[t.name] = name[m[4]:m[5]]
		name = name[:m[2]] + name[m[3]:]
	}
	return name, found
}

// collector exports a Host's stats the way Envoy's /stats/prometheus does: each stat's
// tag-extracted name sanitised (tollgate.requests_allowed → tollgate_requests_allowed,
// counters without a _total suffix), its tags as labels, counters as counters, gauges
// as gauges and histograms as histograms on Envoy's default buckets.
type collector struct {
	tags []tagExtractor
	// stats returns the metrics to export (the plugin's and the host's own).
	stats func() []Metric
}

func (c *collector) Describe(chan<- *prometheus.Desc) {} // unchecked: the stats appear as plugins define them

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	type series struct {
		m      Metric
		labels map[string]string
	}
	fams := map[string][]series{}
	var order []string
	for _, m := range c.stats() {
		name, labels := extractTags(c.tags, m.Name)
		pn := PrometheusName(name)
		if _, ok := fams[pn]; !ok {
			order = append(order, pn)
		}
		fams[pn] = append(fams[pn], series{m, labels})
	}
	for _, pn := range order {
		ss := fams[pn]
		// Every series of a family carries the same label names (Prometheus requires it):
		// a tag a stat lacks is the empty label.
		var names []string
		for _, s := range ss {
			for k := range s.labels {
				if !contains(names, k) {
					names = append(names, k)
				}
			}
		}
		sort.Strings(names)
		desc := prometheus.NewDesc(pn, "Envoy stat "+ss[0].m.Name, names, nil)
		for _, s := range ss {
			vals := make([]string, len(names))
			for i, k := range names {
				vals[i] = s.labels[k]
			}
			var pm prometheus.Metric
			var err error
			switch s.m.Type {
			case MetricCounter:
				pm, err = prometheus.NewConstMetric(desc, prometheus.CounterValue, float64(s.m.Value), vals...)
			case MetricGauge:
				pm, err = prometheus.NewConstMetric(desc, prometheus.GaugeValue, float64(s.m.Value), vals...)
			default:
				b := make(map[float64]uint64, len(HistogramBuckets))
				for i, bound := range HistogramBuckets {
					b[bound] = s.m.Buckets[i]
				}
				pm, err = prometheus.NewConstHistogram(desc, s.m.Count, float64(s.m.Sum), b, vals...)
			}
			if err != nil {
				ch <- prometheus.NewInvalidMetric(desc, err)
				continue
			}
			ch <- pm
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// writePrometheus writes what reg gathers in the Prometheus text format.
func writePrometheus(w io.Writer, reg prometheus.Gatherer) error {
	fams, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("gather metrics: %w", err)
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return fmt.Errorf("write metric %q: %w", f.GetName(), err)
		}
	}
	return nil
}

// MetricSnapshot returns every plugin-defined metric, sorted by name.
func (h *Host) MetricSnapshot() []Metric {
	h.flushGuests()
	return h.metrics.snapshot()
}

// flushGuests asks every worker's module that keeps counts between ticks to hand them
// over (tollgate_flush_metrics), so that a read of the metrics sees every callback that
// has returned: Envoy's stats would see them at the filter's next tick.
func (h *Host) flushGuests() {
	for _, v := range h.vms {
		if v.fns.flushMetrics == nil {
			continue
		}
		v.mu.Lock()
		if v.root != nil {
			_, _ = v.call(v.root, v.fns.flushMetrics)
		}
		v.mu.Unlock()
	}
}

// Metrics returns plugin metrics by name: counter and gauge values, and the last
// recorded value of histograms.
func (h *Host) Metrics() map[string]int64 {
	h.flushGuests()
	out := make(map[string]int64)
	for _, m := range h.metrics.snapshot() {
		out[m.Name] = m.Value
	}
	return out
}

// WritePrometheus writes the plugin's metrics and the host's own counters (wasmhost_*)
// in the Prometheus text format, as Envoy's /stats/prometheus does (see Gatherer).
func (h *Host) WritePrometheus(w io.Writer) error { return writePrometheus(w, h.registry) }

// Gatherer serves the plugin's metrics as Envoy's /stats/prometheus would: names with
// the stats tags cut out and sanitised (PrometheusName), the tags as labels, counters,
// gauges and histograms (on Envoy's default buckets) as such; and the host's own
// counters, wasmhost_*.
func (h *Host) Gatherer() prometheus.Gatherer { return h.registry }
