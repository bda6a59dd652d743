package rule

import "strings"

// DescriptorMatch selects Envoy rate limit service descriptors (the entries Envoy's
// native rate limit filter builds from a route's rate limit actions): a descriptor of
// the request's Domain matches when it has exactly these entries, in this order, each
// with the same key and, where the entry names a value, that value.
//
// The caller key of a matching descriptor is the values of the entries without a
// value, joined with ":" (as a composite key source joins its parts): a descriptor
// [api_key=alice] is caller "alice", the same key the filter extracts from an x-api-key
// header, so both paths charge one bucket. When every entry names a value, every
// matching descriptor shares one bucket, keyed by the domain.
type DescriptorMatch struct {
	Domain  string
	Entries []DescriptorMatchEntry
	// Replaces lists rules (by id, each with a descriptor match) that a rate limit
	// service request in which a descriptor selects this rule does not apply, to any of
	// its descriptors: a specific limit stands in for a general one when both are asked
	// in one request (envoyproxy/ratelimit's "replaces").
	Replaces []string
}

// DescriptorMatchEntry is one entry of a DescriptorMatch. Any (no value configured)
// matches every value but those in Except, and the value becomes part of the caller
// key. Except lets a rule for "any value" leave the values that a more specific rule
// handles to that rule alone.
type DescriptorMatchEntry struct {
	Key    string
	Value  string
	Any    bool
	Except []string
}

// DescriptorEntry is one entry of a request's descriptor.
type DescriptorEntry struct {
	Key, Value string
}

// Key returns the caller key of a descriptor's entries under the match, and whether
// the descriptor matches.
func (m *DescriptorMatch) Key(domain string, entries []DescriptorEntry) (string, bool) {
	if m == nil || domain != m.Domain || len(entries) != len(m.Entries) {
		return "", false
	}
	wild := 0
	for i := range m.Entries {
		me, e := &m.Entries[i], &entries[i]
		if me.Key != e.Key || e.Value == "" || !me.Any && me.Value != e.Value {
			return "", false
		}
		for _, x := range me.Except {
			if x == e.Value {
				return "", false
			}
		}
		if me.Any {
			wild++
		}
	}
	if wild == 0 {
		return shortenKey(m.Domain), true
	}
	if wild == 1 {
		for i := range m.Entries {
			if m.Entries[i].Any {
				return shortenKey(entries[i].Value), true
			}
		}
	}
	var b strings.Builder
	for i := range m.Entries {
		if !m.Entries[i].Any {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(':')
		}
		b.WriteString(entries[i].Value)
	}
	return shortenKey(b.String()), true
}

// ApplyDescriptor appends to dst every rule whose descriptor match matches the
// descriptor, in config order, resolved as Apply resolves an HTTP request's rules:
// the caller key (DescriptorMatch.Key), windows (override > tier > the rule's own) and
// the rule's cost. Tiers are chosen by key only: a descriptor has no headers, so a tier
// defined by a request header never applies here.
func (c *Config) ApplyDescriptor(domain string, entries []DescriptorEntry, dst []Applied) []Applied {
	if c == nil {
		return dst
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		key, ok := r.Descriptors.Key(domain, entries)
		if !ok || key == "" {
			continue
		}
		a := Applied{Rule: r, Key: key, Windows: r.Windows, Cost: r.Cost, Index: i}
		if o := r.overrideFor(key); o >= 0 {
			a.Windows, a.Override = r.Overrides[o].Windows, o+1
		} else if len(r.Tiers) > 0 {
			if t := c.Tier(nil, key); t != "" {
				if w, ok := r.Tiers[t]; ok {
					a.Windows, a.Tier = w, t
				}
			}
		}
		dst = append(dst, a)
	}
	return dst
}
