package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
)

// diff prints what applying the file would change, rule by rule: "+ rule ID" for a rule
// the service lacks, "- rule ID" for one the file drops, "~ rule ID" with the old and
// new JSON for a changed one, and "~ FIELD" for other top-level fields (tiers, lists).
// Exit 0 when nothing would change, 1 when something would (as diff(1)).
//
// Hand-written rather than a text diff: a rule set is a list of rules identified by
// id, and a reordered or reformatted file changes nothing the service does.
func (x *command) diff(ctx context.Context, name string) (int, error) {
	js, err := readRules(name, x.stdin)
	if err != nil {
		return 0, err
	}
	var cur json.RawMessage
	if _, err := x.c.do(ctx, "GET", "/v1/rules", "", nil, &cur); err != nil {
		return 0, err
	}
	changes, err := ruleDiff(cur, js)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	if len(changes) == 0 {
		fmt.Fprintf(x.stdout, "%s: no change\n", name)
		return 0, nil
	}
	for _, c := range changes {
		fmt.Fprintln(x.stdout, c)
	}
	return 1, nil
}

// ruleDiff compares two rule-set documents.
func ruleDiff(oldDoc, newDoc []byte) ([]string, error) {
	var o, n map[string]json.RawMessage
	if err := json.Unmarshal(oldDoc, &o); err != nil {
		return nil, fmt.Errorf("the service's rule set is not a JSON object: %w", err)
	}
	if err := json.Unmarshal(newDoc, &n); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	oRules, err := rulesByID(o["rules"])
	if err != nil {
		return nil, fmt.Errorf("the service's rule set: %w", err)
	}
	nRules, err := rulesByID(n["rules"])
	if err != nil {
		return nil, err
	}
	var out []string
	ids := sortedKeys(oRules)
	for _, id := range sortedKeys(nRules) {
		if _, ok := oRules[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		a, inOld := oRules[id]
		b, inNew := nRules[id]
		switch {
		case !inOld:
			out = append(out, fmt.Sprintf("+ rule %s: %s", id, b))
		case !inNew:
			out = append(out, fmt.Sprintf("- rule %s: %s", id, a))
		case a != b:
			out = append(out, fmt.Sprintf("~ rule %s:\n    was %s\n    now %s", id, a, b))
		}
	}
	// The service numbers versions itself: a file's "version" changes nothing.
	for _, k := range []string{"rules", "version"} {
		delete(o, k)
		delete(n, k)
	}
	keys := sortedKeys(o)
	for _, k := range sortedKeys(n) {
		if _, ok := o[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		a, b := canonical(o[k]), canonical(n[k])
		if a != b {
			out = append(out, fmt.Sprintf("~ %s:\n    was %s\n    now %s", k, orNone(a), orNone(b)))
		}
	}
	return out, nil
}

// rulesByID maps each rule's id to its canonical JSON.
func rulesByID(raw json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	if len(raw) == 0 {
		return out, nil
	}
	var rs []json.RawMessage
	if err := json.Unmarshal(raw, &rs); err != nil {
		return nil, fmt.Errorf("rules: not a list: %w", err)
	}
	for i, r := range rs {
		var head struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(r, &head); err != nil {
			return nil, fmt.Errorf("rules[%d]: %w", i, err)
		}
		out[head.ID] = canonical(r)
	}
	return out, nil
}

// canonical re-encodes JSON with sorted keys and no spaces, so formatting and field
// order do not count as changes.
func canonical(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return string(raw)
	}
	return string(b)
}

func orNone(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}
