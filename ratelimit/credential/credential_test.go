package credential

import (
	"strings"
	"testing"
)

func TestIssueVerify(t *testing.T) {
	const master = "m4ster"
	tok, err := Issue([]byte(master), "gw-1.eu")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, Prefix+"gw-1.eu.") {
		t.Fatalf("token %q does not name its node", tok)
	}
	other, _ := Issue([]byte(master), "gw-2")
	tests := []struct {
		name, tok string
		masters   []string
		node      string
		ok        bool
	}{
		{"issued by the master", tok, []string{master}, "gw-1.eu", true},
		{"one of several masters (rotation)", tok, []string{"new", master}, "gw-1.eu", true},
		{"another master", tok, []string{"new"}, "", false},
		{"no master", tok, nil, "", false},
		{"node renamed", strings.Replace(tok, "gw-1.eu", "gw-2", 1), []string{master}, "", false},
		{"another node's MAC", Prefix + "gw-1.eu" + other[strings.LastIndexByte(other, '.'):], []string{master}, "", false},
		{"MAC cut short", tok[:len(tok)-2], []string{master}, "", false},
		{"no prefix", strings.TrimPrefix(tok, Prefix), []string{master}, "", false},
		{"master secret itself", master, []string{master}, "", false},
		{"empty node", Prefix + "." + tok[strings.LastIndexByte(tok, '.')+1:], []string{master}, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node, ok := Verify(tc.tok, tc.masters)
			if ok != tc.ok || (ok && node != tc.node) {
				t.Fatalf("Verify = %q, %v; want %q, %v", node, ok, tc.node, tc.ok)
			}
		})
	}
}

func TestIssueRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ master, node string }{
		"empty node":     {"m", ""},
		"space in node":  {"m", "gw 1"},
		"newline":        {"m", "gw\n1"},
		"too long":       {"m", strings.Repeat("n", 1<<12)},
		"empty master":   {"", "gw"},
		"non-ASCII node": {"m", "gw-é"},
	} {
		t.Run(name, func(t *testing.T) {
			if tok, err := Issue([]byte(tc.master), tc.node); err == nil {
				t.Fatalf("Issue(%q, %q) = %q, want an error", tc.master, tc.node, tok)
			}
		})
	}
}

func FuzzVerify(f *testing.F) {
	tok, _ := Issue([]byte("m"), "gw")
	f.Add(tok)
	f.Add(Prefix + "a.b.c")
	f.Fuzz(func(t *testing.T, s string) {
		node, ok := Verify(s, []string{"m"})
		if ok {
			want, err := Issue([]byte("m"), node)
			if err != nil || want != s {
				t.Fatalf("Verify(%q) accepted node %q whose token is %q", s, node, want)
			}
		}
	})
}
