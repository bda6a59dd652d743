package algo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestKindProperties pins every kind's row: its value (the wire protocol, the state's
// tag byte and lease.lua depend on it), its name and each property callers ask about.
// A new kind fails here until it has its line.
func TestKindProperties(t *testing.T) {
	tests := []struct {
		kind                                                Kind
		value                                               int
		name                                                string
		maxLimit                                            int64
		burst, refills, windowed, boundary, calendar, fixed bool
		configuredAs                                        Kind
	}{
		{TokenBucket, 0, "token_bucket", MaxLimit, true, true, false, false, false, true, TokenBucket},
		{GCRA, 1, "gcra", MaxLimit, true, true, false, false, false, true, GCRA},
		{SlidingWindowLog, 2, "sliding_window_log", MaxLogLimit, false, false, false, false, false, false, SlidingWindowLog},
		{SlidingWindowCounter, 3, "sliding_window_counter", MaxLimit, false, false, true, false, false, true, SlidingWindowCounter},
		{FixedWindow, 4, "fixed_window", MaxLimit, false, false, true, true, false, true, FixedWindow},
		{Calendar, 5, "calendar", MaxLimit, false, false, true, true, true, true, FixedWindow},
	}
	if len(tests) != NumKinds {
		t.Fatalf("%d kinds pinned here, NumKinds is %d", len(tests), NumKinds)
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := tt.kind
			if int(k) != tt.value || int(k) != i {
				t.Errorf("value %d, want %d (kinds are numbered in order)", k, tt.value)
			}
			if got := stateTag(k); got != byte(0x10+tt.value) {
				t.Errorf("state tag %#x, want %#x", got, 0x10+tt.value)
			}
			if !k.Valid() || k.String() != tt.name {
				t.Errorf("Valid() = %v, String() = %q", k.Valid(), k.String())
			}
			if p, ok := ParseKind(tt.name); !ok || p != k {
				t.Errorf("ParseKind(%q) = %v, %v", tt.name, p, ok)
			}
			got := []any{k.MaxLimit(), k.HasBurst(), k.Refills(), k.CanShape(), k.Windowed(), k.ResetsAtBoundary(), k.CalendarPeriods(), k.FixedSizeState(), k.ConfiguredAs()}
			want := []any{tt.maxLimit, tt.burst, tt.refills, tt.refills, tt.windowed, tt.boundary, tt.calendar, tt.fixed, tt.configuredAs}
			names := []string{"MaxLimit", "HasBurst", "Refills", "CanShape", "Windowed", "ResetsAtBoundary", "CalendarPeriods", "FixedSizeState", "ConfiguredAs"}
			for j := range got {
				if got[j] != want[j] {
					t.Errorf("%s() = %v, want %v", names[j], got[j], want[j])
				}
			}
		})
	}
	// An unknown kind (a wire delta may carry any byte) has no property and no name.
	u := Kind(NumKinds)
	if u.Valid() || u.HasBurst() || u.Refills() || u.CanShape() || u.Windowed() || u.ResetsAtBoundary() ||
		u.CalendarPeriods() || u.FixedSizeState() || u.ConfiguredAs() != u || u.MaxLimit() != MaxLimit || u.String() != "kind(6)" {
		t.Errorf("unknown kind %d has properties or a name", u)
	}
	if ks := Kinds(); len(ks) != NumKinds || ks[0] != TokenBucket || ks[NumKinds-1] != Calendar {
		t.Errorf("Kinds() = %v", ks)
	}
}

// TestKindBehaviour checks the properties against what each algorithm does, so a row
// cannot claim what its implementation does not: after all permits of a window of 10
// per 10 s are taken, one comes back after 1 s only where the kind Refills; all of
// them come back exactly at the window's end only where it ResetsAtBoundary; Burst
// sets the capacity only where HasBurst; the state stays within MaxStateSize at the
// largest limit only where FixedSizeState.
func TestKindBehaviour(t *testing.T) {
	const day0 = 19_700 * 86_400_000_000 // a day start, hence a 10 s window's start too
	for _, k := range Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			p := Params{Kind: k, Limit: 10, WindowUs: 10 * second}
			if k.CalendarPeriods() {
				p = CalendarParams(10, Day, 0)
			}
			t0 := int64(day0 + second)
			s := Take(p, nil, t0, p.Limit)
			if got := Available(p, s, t0+p.WindowUs/p.Limit) >= 1; got != k.Refills() {
				t.Errorf("a permit back one permit's time after emptying: %v, Refills() = %v", got, k.Refills())
			}
			_, _, end := CalendarWindow(p, t0)
			atEnd := Available(p, s, end) == p.Limit && Available(p, s, end-1) == 0
			if atEnd != k.ResetsAtBoundary() {
				t.Errorf("everything back exactly at the window's end (%d): %v, ResetsAtBoundary() = %v", end, atEnd, k.ResetsAtBoundary())
			}
			if _, _, ok := p.Calendar(); ok != k.CalendarPeriods() {
				t.Errorf("Params.Calendar() ok = %v, CalendarPeriods() = %v", ok, k.CalendarPeriods())
			}
			if !k.CalendarPeriods() {
				b := p
				b.Burst = 25
				if got := b.Capacity() == 25; got != k.HasBurst() {
					t.Errorf("Burst 25 sets the capacity: %v, HasBurst() = %v", got, k.HasBurst())
				}
			}
			big := Params{Kind: k, Limit: k.MaxLimit(), WindowUs: MaxWindowUs}
			if k.CalendarPeriods() {
				big = CalendarParams(k.MaxLimit(), Month, 0)
			}
			if got := big.MaxStateLen() <= MaxStateSize; got != k.FixedSizeState() {
				t.Errorf("MaxStateLen() %d within MaxStateSize: %v, FixedSizeState() = %v", big.MaxStateLen(), got, k.FixedSizeState())
			}
			if c := k.ConfiguredAs(); c.ConfiguredAs() != c {
				t.Errorf("configured as %v, which is itself configured as %v", c, c.ConfiguredAs())
			}
		})
	}
}

// TestEveryKindHasARow fails when a Kind constant is declared without its row in
// kinds: the constants of the block that declares TokenBucket must be exactly the
// NumKinds rows, each complete.
func TestEveryKindHasARow(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var consts []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			// In a const block, a spec without a type or values repeats the one above.
			isKind := false
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if vs.Type != nil || len(vs.Values) > 0 {
					id, ok := vs.Type.(*ast.Ident)
					isKind = ok && id.Name == "Kind"
				}
				if isKind {
					for _, n := range vs.Names {
						consts = append(consts, n.Name)
					}
				}
			}
		}
	}
	if len(consts) != NumKinds {
		t.Fatalf("Kind constants %v, but %d rows in kinds: every kind needs its row", consts, NumKinds)
	}
	seen := map[string]bool{}
	for _, k := range Kinds() {
		r := kinds[k]
		if r.name == "" || r.ops == nil || r.maxLimit < 1 || !r.configuredAs.Valid() || seen[r.name] {
			t.Errorf("kind %d (%s): incomplete or duplicate row %+v", k, consts[k], r)
		}
		seen[r.name] = true
	}
}
