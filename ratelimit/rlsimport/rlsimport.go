// Package rlsimport converts an envoyproxy/ratelimit configuration (the YAML file of one
// domain: nested descriptors with key and optional value, rate_limit with
// requests_per_unit and unit, unlimited, name and replaces, shadow_mode,
// detailed_metric) into a Tollgate rule set whose rules select the same descriptors
// through the rate limit service (shared/rule descriptor matches) and decide them the
// same way. What cannot be expressed is named by its YAML path, never guessed.
//
// How the original decides, and how each part is carried over:
//
//   - A request descriptor walks the tree one entry at a time: at each level the child
//     with the entry's key and value is taken if there is one, else the child with the
//     key and no value; the walk never goes back. The limit applies only when the walk
//     ends on a node with a rate_limit after the descriptor's last entry, so a limit
//     applies to descriptors exactly as long as its path. Each limited node becomes a
//     rule whose descriptor match is its path; an entry without a value excepts the
//     values its valued siblings take ("except"), which is the walk's preference for
//     the specific node.
//   - Counters are kept per domain and the descriptor's entries (values included), in
//     windows aligned to the Unix epoch (unit: second, minute, hour, day, week = 7
//     days, month = 30 days, year = 365 days). A rule's bucket is per the values of its
//     entries without a value (its fixed values are the same for all), and its
//     fixed_window windows are aligned to the epoch too. A year is longer than
//     Tollgate's longest window (31 days): such a limit is not converted.
//   - unlimited: the descriptor is never limited, which a node without a rule gives (a
//     descriptor no rule selects is answered OK); its siblings still except its value.
//   - shadow_mode: the rule's shadow (decided, charged, reported, never refused).
//   - name and replaces: when a request's descriptors select a limit that replaces a
//     name, limits of that name are not applied to the request; descriptors.replaces
//     names the rules of those limits.
//   - detailed_metric, value_to_metric and metadata only change statistics or response
//     metadata: they are dropped, with a note (Tollgate's metrics are per rule, never per
//     caller value).
//
// Not convertible (a Problem names the path): wildcard values ("foo*"), quota_mode,
// share_threshold, requests_per_unit 0 or beyond what a window can hold, the year
// unit, an unlimited limit that replaces others, paths deeper than
// rule.MaxDescriptorEntries, keys or values a descriptor match refuses, and anything
// envoyproxy/ratelimit itself refuses (unknown fields, duplicate descriptors, a unit
// with unlimited, an empty key or domain).
package rlsimport

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/rule"
)

// Issue is something about one place of the original configuration.
type Issue struct {
	Path string // YAML path, e.g. descriptors[0].descriptors[1].rate_limit.unit ("" = the document)
	Line int    // 1-based line of that place (0: unknown)
	Msg  string
}

// Where is the path with its line: "descriptors[0].key (line 4)".
func (i Issue) Where() string {
	p := i.Path
	if p == "" {
		p = "document"
	}
	if i.Line > 0 {
		p += " (line " + strconv.Itoa(i.Line) + ")"
	}
	return p
}

func (i Issue) String() string { return i.Where() + ": " + i.Msg }

// Result is a conversion.
type Result struct {
	// Rules is the Tollgate rule set (indented JSON) of everything that converted; it
	// always parses with rule.Parse. Nil when nothing did.
	Rules []byte
	// Problems: what could not be converted. The rule set decides differently from
	// the original wherever a problem is named.
	Problems []Issue
	// Notes: what was dropped without changing any decision.
	Notes []Issue
}

// windows maps envoyproxy/ratelimit's units (case-insensitive) to Tollgate windows of
// the same length; both align windows to the Unix epoch.
var windows = map[string]string{
	"second": "1s", "minute": "1m", "hour": "1h", "day": "1d", "week": "7d", "month": "30d",
}

var windowUs = map[string]int64{
	"1s": 1_000_000, "1m": 60_000_000, "1h": 3_600_000_000, "1d": 86_400_000_000,
	"7d": 7 * 86_400_000_000, "30d": 30 * 86_400_000_000,
}

type limit struct {
	path      string // of rate_limit
	perUnit   int64
	window    string
	unlimited bool
	name      string
	replaces  []replace
	bad       bool // a problem was named: no rule
}

type replace struct {
	path, name string
}

type node struct {
	path     string
	key      string
	value    string // "" = any value
	wildcard bool
	limit    *limit
	shadow   bool
	bad      bool // the node itself cannot be converted: neither it nor its subtree
	children []*node
}

type converter struct {
	res    Result
	domain string
	lines  map[string]int // the line of each path read
}

func (c *converter) problem(path, format string, args ...any) {
	c.res.Problems = append(c.res.Problems, Issue{Path: path, Line: c.lines[path], Msg: fmt.Sprintf(format, args...)})
}

func (c *converter) note(path, format string, args ...any) {
	c.res.Notes = append(c.res.Notes, Issue{Path: path, Line: c.lines[path], Msg: fmt.Sprintf(format, args...)})
}

// Convert converts one envoyproxy/ratelimit configuration file.
func Convert(data []byte) *Result {
	c := &converter{lines: map[string]int{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		c.problem("", "not YAML: %v", err)
		return &c.res
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		c.problem("", "must be a mapping with domain and descriptors, got an empty document")
		return &c.res
	}
	if deref(doc.Content[0]).Kind != yaml.MappingNode {
		c.problem("", "must be a mapping with domain and descriptors, got %s", kind(doc.Content[0]))
		return &c.res
	}
	root := c.mapping("", doc.Content[0])
	for _, k := range root.keys {
		if k != "domain" && k != "descriptors" {
			c.problem(k, "unknown field (envoyproxy/ratelimit refuses it too)")
		}
	}
	c.domain, _ = c.str("domain", root.get("domain"))
	switch {
	case c.domain == "":
		c.problem("domain", "required, must not be empty")
	case !token(c.domain):
		c.problem("domain", "must be visible ASCII without spaces, at most 128 bytes, for a Tollgate descriptor match, got %q", c.domain)
	}
	tree := c.descriptors("descriptors", root.get("descriptors"))
	if token(c.domain) {
		c.emit(tree)
	}
	return &c.res
}

// fields is a YAML mapping's values by key, in file order.
type fields struct {
	keys []string
	vals map[string]*yaml.Node
}

func (f *fields) get(k string) *yaml.Node { return f.vals[k] }

// mapping reads a mapping node at path, recording the line of each field; nil (and a
// problem) when the node is something else. A key given twice is refused, as
// envoyproxy/ratelimit's YAML decoder refuses it.
func (c *converter) mapping(path string, n *yaml.Node) *fields {
	n = deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		c.problem(path, "must be a mapping, got %s", kind(n))
		return nil
	}
	f := &fields{vals: map[string]*yaml.Node{}}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		p := join(path, k.Value)
		c.lines[p] = k.Line
		if _, dup := f.vals[k.Value]; dup {
			c.problem(p, "given twice")
			continue
		}
		f.keys = append(f.keys, k.Value)
		f.vals[k.Value] = v
	}
	return f
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// deref follows an alias to its anchor.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 16; i++ {
		n = n.Alias
	}
	return n
}

// descriptors reads one level of the tree.
func (c *converter) descriptors(path string, v *yaml.Node) []*node {
	v = deref(v)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		c.problem(path, "must be a list of descriptors, got %s", kind(v))
		return nil
	}
	var out []*node
	seen := map[string]string{}
	for i, e := range v.Content {
		p := path + "[" + strconv.Itoa(i) + "]"
		c.lines[p] = e.Line
		n := c.descriptor(p, e)
		if n == nil {
			continue
		}
		composite := n.key
		if n.value != "" {
			composite += "_" + n.value
		}
		if first, dup := seen[composite]; dup {
			c.problem(p, "duplicate descriptor %q (first at %s; envoyproxy/ratelimit refuses it)", composite, first)
			continue
		}
		seen[composite] = p
		out = append(out, n)
	}
	return out
}

func (c *converter) descriptor(path string, v *yaml.Node) *node {
	m := c.mapping(path, v)
	if m == nil {
		return nil
	}
	n := &node{path: path}
	for _, k := range m.keys {
		p := path + "." + k
		switch k {
		case "key", "value", "rate_limit", "descriptors", "shadow_mode":
		case "detailed_metric", "value_to_metric":
			if b, _ := c.boolean(p, m.get(k)); b {
				c.note(p, "dropped: Tollgate counts decisions per rule (each converted limit is its own rule), never per descriptor value, which may be personal data")
			}
		case "metadata":
			c.note(p, "dropped: Tollgate's rate limit service sends no per-limit response metadata")
		case "quota_mode":
			if b, _ := c.boolean(p, m.get(k)); b {
				c.problem(p, "quota mode (over-limit requests allowed and only reported) has no Tollgate equivalent")
			}
		case "share_threshold":
			if b, _ := c.boolean(p, m.get(k)); b {
				c.problem(p, "shared wildcard thresholds have no Tollgate equivalent")
			}
		default:
			c.problem(p, "unknown field (envoyproxy/ratelimit refuses it too)")
		}
	}
	var ok2 bool
	if n.key, ok2 = c.str(path+".key", m.get("key")); !ok2 || n.key == "" {
		if ok2 {
			c.problem(path+".key", "required, must not be empty")
		}
		return nil
	}
	if !token(n.key) {
		c.problem(path+".key", "must be visible ASCII without spaces, at most 128 bytes, for a Tollgate descriptor match, got %q", n.key)
		n.bad = true
	}
	n.value, _ = c.str(path+".value", m.get("value"))
	if strings.Contains(n.value, "*") {
		// The walk tries wildcard patterns between the exact value and the key alone;
		// a descriptor match knows one value or any value.
		c.problem(path+".value", "wildcard value %q: a Tollgate descriptor match takes one exact value or any value", n.value)
		n.wildcard, n.bad = true, true
	} else if n.value != "" {
		if msg := valueProblem(n.value); msg != "" {
			c.problem(path+".value", "%s", msg)
			n.bad = true
		}
	}
	n.shadow, _ = c.boolean(path+".shadow_mode", m.get("shadow_mode"))
	if rl := m.get("rate_limit"); !isNull(rl) {
		n.limit = c.rateLimit(path+".rate_limit", rl)
	}
	n.children = c.descriptors(path+".descriptors", m.get("descriptors"))
	return n
}

func (c *converter) rateLimit(path string, v *yaml.Node) *limit {
	m := c.mapping(path, v)
	if m == nil {
		return &limit{path: path, bad: true}
	}
	l := &limit{path: path}
	for _, k := range m.keys {
		switch k {
		case "requests_per_unit", "unit", "unlimited", "name", "replaces":
		default:
			c.problem(path+"."+k, "unknown field (envoyproxy/ratelimit refuses it too)")
			l.bad = true
		}
	}
	l.unlimited, _ = c.boolean(path+".unlimited", m.get("unlimited"))
	l.name, _ = c.str(path+".name", m.get("name"))
	unit, _ := c.str(path+".unit", m.get("unit"))
	unit = strings.ToLower(unit)
	if l.unlimited {
		if unit != "" {
			c.problem(path+".unit", "must not be set when unlimited (envoyproxy/ratelimit refuses it)")
			l.bad = true
		}
	} else {
		switch w, ok := windows[unit]; {
		case ok:
			l.window = w
		case unit == "year":
			c.problem(path+".unit", "a year (365 days) is longer than Tollgate's longest window (31d)")
			l.bad = true
		case unit == "":
			c.problem(path+".unit", "required (second, minute, hour, day, week, month or year)")
			l.bad = true
		default:
			c.problem(path+".unit", "unknown unit %q (want second, minute, hour, day, week, month or year)", unit)
			l.bad = true
		}
		p := path + ".requests_per_unit"
		n, ok := c.integer(p, m.get("requests_per_unit"))
		switch {
		case !ok:
			l.bad = true
		case n == 0:
			c.problem(p, "0 refuses every request; a Tollgate limit is at least 1")
			l.bad = true
		case l.window != "":
			prm := algo.Params{Kind: algo.FixedWindow, Limit: n, WindowUs: windowUs[l.window]}
			if err := prm.Validate(); err != nil {
				c.problem(p, "%d per %s: %v", n, unit, err)
				l.bad = true
			}
		}
		l.perUnit = n
	}
	if rv := deref(m.get("replaces")); !isNull(rv) {
		var list []*yaml.Node
		if rv.Kind == yaml.SequenceNode {
			list = rv.Content
		} else {
			c.problem(path+".replaces", "must be a list of {name: ...}, got %s", kind(rv))
			l.bad = true
		}
		for i, e := range list {
			p := path + ".replaces[" + strconv.Itoa(i) + "]"
			c.lines[p] = e.Line
			em := c.mapping(p, e)
			if em == nil {
				l.bad = true
				continue
			}
			for _, k := range em.keys {
				if k != "name" {
					c.problem(p+"."+k, "unknown field (envoyproxy/ratelimit refuses it too)")
				}
			}
			name, _ := c.str(p+".name", em.get("name"))
			switch {
			case name == "":
				c.problem(p+".name", "required, must not be empty (envoyproxy/ratelimit refuses it)")
				l.bad = true
			case name == l.name:
				c.problem(p+".name", "a limit cannot replace itself (envoyproxy/ratelimit refuses it)")
				l.bad = true
			default:
				l.replaces = append(l.replaces, replace{p + ".name", name})
			}
		}
		if l.unlimited && len(l.replaces) > 0 {
			c.problem(path+".replaces", "an unlimited limit that replaces others has no Tollgate equivalent (only a rule that limits can replace)")
			l.bad = true
		}
	}
	return l
}

// ruleJSON is one rule of the output, in the schema's field order.
type ruleJSON struct {
	ID          string         `json:"id"`
	Algorithm   string         `json:"algorithm"`
	Limit       int64          `json:"limit"`
	Window      string         `json:"window"`
	Shadow      bool           `json:"shadow,omitempty"`
	Descriptors descriptorJSON `json:"descriptors"`
}

type descriptorJSON struct {
	Domain   string      `json:"domain"`
	Entries  []entryJSON `json:"entries"`
	Replaces []string    `json:"replaces,omitempty"`
}

type entryJSON struct {
	Key    string   `json:"key"`
	Value  string   `json:"value,omitempty"`
	Except []string `json:"except,omitempty"`
}

type pending struct {
	r *ruleJSON
	l *limit
}

// emit walks the tree and writes the rule set.
func (c *converter) emit(tree []*node) {
	var out []pending
	var walk func(level []*node, path []entryJSON)
	walk = func(level []*node, path []entryJSON) {
		for _, n := range level {
			if n.bad {
				if k := limitsIn(n.children); k > 0 {
					c.problem(n.path, "the %d limits beneath are not converted either", k)
				}
				continue
			}
			e := entryJSON{Key: n.key, Value: n.value}
			if n.value == "" {
				// The walk prefers a sibling with this key and the descriptor's value.
				for _, s := range level {
					if s.key == n.key && s.value != "" && !s.wildcard && valueProblem(s.value) == "" {
						e.Except = append(e.Except, s.value)
					}
				}
				if len(e.Except) > rule.MaxDescriptorExcept {
					c.problem(n.path, "%d siblings with values: a Tollgate entry excepts at most %d", len(e.Except), rule.MaxDescriptorExcept)
					continue
				}
			}
			p := append(slices.Clone(path), e)
			if l := n.limit; l != nil && !l.bad && !l.unlimited {
				if len(p) > rule.MaxDescriptorEntries {
					c.problem(l.path, "a limit %d entries deep: a Tollgate descriptor match has at most %d", len(p), rule.MaxDescriptorEntries)
				} else {
					out = append(out, pending{&ruleJSON{Algorithm: "fixed_window", Limit: l.perUnit, Window: l.window, Shadow: n.shadow,
						Descriptors: descriptorJSON{Domain: c.domain, Entries: p}}, l})
				}
			}
			walk(n.children, p)
		}
	}
	walk(tree, nil)
	c.name(out)
	c.link(tree, out)
	if len(out) == 0 {
		return
	}
	doc := struct {
		Rules []*ruleJSON `json:"rules"`
	}{}
	for _, p := range out {
		doc.Rules = append(doc.Rules, p.r)
	}
	js, err := json.MarshalIndent(doc, "", "  ")
	if err == nil {
		_, err = rule.Parse(js)
	}
	if err != nil {
		// Every bound was checked above: a refusal here is a converter defect, and a
		// rule set that does not parse must not be offered.
		c.problem("", "converted rule set does not parse (converter defect): %v", err)
		return
	}
	c.res.Rules = append(js, '\n')
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// name gives each rule its id: the limit's name where that is a valid, unique rule id,
// else one derived from the descriptor path.
func (c *converter) name(out []pending) {
	names := map[string]int{}
	for _, p := range out {
		names[p.l.name]++
	}
	used := map[string]bool{}
	for _, p := range out {
		if n := p.l.name; n != "" && names[n] == 1 && idRE.MatchString(n) {
			p.r.ID = n
			used[n] = true
		}
	}
	for _, p := range out {
		if p.r.ID != "" {
			continue
		}
		if p.l.name != "" {
			c.note(p.l.path+".name", "%q is not a unique rule id ([A-Za-z0-9_.-]{1,64}): the rule is named after its descriptor path", p.l.name)
		}
		var b strings.Builder
		b.WriteString(c.domain)
		for _, e := range p.r.Descriptors.Entries {
			b.WriteString("." + e.Key)
			if e.Value != "" {
				b.WriteString("_" + e.Value)
			}
		}
		full := b.String()
		id := sanitize(full)
		if len(id) > 64 || used[id] {
			h := fnv.New64a()
			h.Write([]byte(full))
			suffix := fmt.Sprintf("-%016x", h.Sum64())
			id = id[:min(len(id), 64-len(suffix))] + suffix
		}
		p.r.ID = id
		used[id] = true
	}
}

// link fills descriptors.replaces: the rules of the limits each limit's replaces names.
func (c *converter) link(tree []*node, out []pending) {
	byName := map[string][]string{}
	for _, p := range out {
		if p.l.name != "" {
			byName[p.l.name] = append(byName[p.l.name], p.r.ID)
		}
	}
	defined := map[string]bool{}
	var walk func([]*node)
	walk = func(level []*node) {
		for _, n := range level {
			if n.limit != nil && n.limit.name != "" {
				defined[n.limit.name] = true
			}
			walk(n.children)
		}
	}
	walk(tree)
	for _, p := range out {
		for _, r := range p.l.replaces {
			if !defined[r.name] {
				c.note(r.path, "no limit is named %q: replacing it changes nothing", r.name)
				continue
			}
			// A name whose limits are unlimited or not converted has no rule to drop.
			for _, id := range byName[r.name] {
				if !slices.Contains(p.r.Descriptors.Replaces, id) {
					p.r.Descriptors.Replaces = append(p.r.Descriptors.Replaces, id)
				}
			}
		}
	}
}

// limitsIn counts the limits (not unlimited) in a subtree.
func limitsIn(level []*node) int {
	k := 0
	for _, n := range level {
		if n.limit != nil && !n.limit.unlimited {
			k++
		}
		k += limitsIn(n.children)
	}
	return k
}

func sanitize(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '.' || ch == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

// token is what a descriptor match accepts as domain or key.
func token(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func valueProblem(s string) string {
	if len(s) > 256 {
		return fmt.Sprintf("%d bytes: a Tollgate descriptor match's value is at most 256", len(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return "control characters: a Tollgate descriptor match's value has none"
		}
	}
	return ""
}

func isNull(n *yaml.Node) bool {
	n = deref(n)
	return n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// str reads a scalar as envoyproxy/ratelimit's YAML decoder (yaml.v2) does for a string
// field: the text as written (so yes and 1.0 stay "yes" and "1.0"), null as absent.
func (c *converter) str(path string, n *yaml.Node) (string, bool) {
	n = deref(n)
	switch {
	case isNull(n):
		return "", true
	case n.Kind == yaml.ScalarNode:
		return n.Value, true
	}
	c.problem(path, "must be a string, got %s", kind(n))
	return "", false
}

// yaml11Bools are YAML 1.1's booleans, which envoyproxy/ratelimit's decoder reads.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"true": true, "True": true, "TRUE": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
	"false": false, "False": false, "FALSE": false,
}

func plain(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0
}

func (c *converter) boolean(path string, n *yaml.Node) (bool, bool) {
	n = deref(n)
	if isNull(n) {
		return false, true
	}
	if plain(n) {
		if b, ok := yaml11Bools[n.Value]; ok {
			return b, true
		}
	}
	c.problem(path, "must be true or false, got %s", kind(n))
	return false, false
}

// integer reads an unsigned 32-bit integer as YAML 1.1 writes it (underscores, 0x, 0o,
// 0b, a leading 0 for octal).
func (c *converter) integer(path string, n *yaml.Node) (int64, bool) {
	n = deref(n)
	if isNull(n) {
		return 0, true
	}
	if plain(n) {
		if i, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 32); err == nil {
			return int64(i), true
		}
	}
	c.problem(path, "must be an integer 0..4294967295, got %s", kind(n))
	return 0, false
}

func kind(n *yaml.Node) string {
	n = deref(n)
	switch {
	case n == nil:
		return "nothing"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Tag == "!!null":
		return "null"
	}
	return strconv.Quote(n.Value)
}
