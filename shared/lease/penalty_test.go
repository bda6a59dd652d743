package lease

import (
	"testing"

	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TestPenaltyCorroboration: with a fleet, the key's penalty level — what every gateway's
// answers carry — stays below the number of distinct gateways that claimed early
// requests for it: one gateway's claims, however many, leave the key unpenalized for
// the others (a forged early=1 once a second climbed a victim to level 7 before), two
// reach level 1. The claimant's own answers carry its own cooldown, stepped by its own
// claims as before, so a lone gateway still penalizes the callers that ignore its
// Retry-After; a one-gateway fleet steps the key's level on its own word.
func TestPenaltyCorroboration(t *testing.T) {
	const start = 1_700_000_000_000_000
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, WindowUs: 60_000_000}
	tests := []struct {
		name      string
		nodes     int64
		claimants []string // one early claim a second, in turn
		probe     string   // the gateway whose answer is looked at, after the claims
		wantLevel int64
	}{
		{"one node of a fleet: another gateway's view", 4, repeat([]string{"atk"}, 20), "victim-gw", 0},
		{"one node of a fleet: its own view", 4, repeat([]string{"atk"}, 20), "atk", 5}, // claims count while the bucket is spent: 5 s
		{"two nodes of a fleet: the second's view", 4, repeat([]string{"atk", "honest"}, 10), "honest", 1},
		{"two nodes of a fleet: a third's view", 4, repeat([]string{"atk", "honest"}, 10), "victim-gw", 1},
		{"three nodes of a fleet", 4, repeat([]string{"a", "b", "c"}, 7), "victim-gw", 2},
		{"a one-node fleet, 5 claims", 1, repeat([]string{"only"}, 5), "only", 5},
		{"no fleet counted, 5 claims", 0, repeat([]string{"only"}, 5), "other", 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := SyncConfig{PenaltyBaseUs: 1_000_000, PenaltyMaxUs: 60_000_000, Nodes: tt.nodes}
			b, pen := &Bucket{}, &Penalty{}
			now := int64(start)
			// Spend the bucket first: a claim counts only while it is spent.
			d := wire.Delta{Key: "k", Rule: "r", Algo: uint8(p.Kind), Limit: 10, WindowMs: 60_000, Over: 10}
			Sync(b, pen, &d, now, cfg)
			for _, node := range tt.claimants {
				now += 1_000_000
				c := cfg
				c.Claimant = NodeTag(node)
				e := wire.Delta{Key: "k", Rule: "r", Algo: uint8(p.Kind), Limit: 10, WindowMs: 60_000, Rejected: 1, Early: 1, ElapsedMs: 1000}
				Sync(b, pen, &e, now, c)
			}
			c := cfg
			c.Claimant = NodeTag(tt.probe)
			probe := wire.Delta{Key: "k", Rule: "r", Algo: uint8(p.Kind), Limit: 10, WindowMs: 60_000, Rejected: 1, ElapsedMs: 1000}
			r := Sync(b, pen, &probe, now, c)
			if r.Level != tt.wantLevel {
				t.Fatalf("%s sees level %d after %d claims from %v over a fleet of %d, want %d", tt.probe, r.Level, len(tt.claimants), uniqueOf(tt.claimants), tt.nodes, tt.wantLevel)
			}
			if tt.wantLevel == 0 && r.PenaltyUs > 0 {
				t.Fatalf("%s sees a cooldown of %d µs at level 0", tt.probe, r.PenaltyUs)
			}
			// The record survives a round trip through its hash fields.
			if got := ParsePenalty(pen.Fields()); got != *pen {
				t.Fatalf("penalty %+v reads back as %+v", *pen, got)
			}
		})
	}
}

func repeat(s []string, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, s...)
	}
	return out
}

func uniqueOf(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
