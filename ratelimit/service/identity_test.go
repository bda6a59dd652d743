package service

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/internal/redistest"
	"github.com/tollgate-rl/tollgate/ratelimit/credential"
	"github.com/tollgate-rl/tollgate/shared/algo"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The tests in this file attack a real service and Redis holding ONE gateway's
// credential (a compromised sidecar): whatever it sends under another gateway's node,
// that gateway's keys stay charged exactly.

// postAs sends b to /v1/sync with the given Authorization credential and extra headers.
func (in *instance) postAs(t testing.TB, cred string, b *wire.Batch, hdr ...string) (int, *wire.Reply, string) {
	t.Helper()
	code, _, out := in.do(t, http.MethodPost, "/v1/sync", cred, encode(b), hdr...)
	if code != http.StatusOK {
		return code, nil, string(out)
	}
	var r wire.Reply
	if err := wire.DecodeReply(out, &r); err != nil {
		t.Fatalf("reply: %v", err)
	}
	return code, &r, ""
}

func issue(t testing.TB, master, node string) string {
	t.Helper()
	tok, err := credential.Issue([]byte(master), node)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// chargeExactly has node report consumption on key in ten batches of 10 (the seqs a
// real gateway would use, from now) with cred, and checks that the bucket of 100 ends
// with nothing available: every report charged once, none taken for a replay.
func chargeExactly(t *testing.T, in *instance, cred string, node, key string, hdr ...string) {
	t.Helper()
	seq := uint64(time.Now().UnixMicro())
	for i := 0; i < 10; i++ {
		d := delta(key, "seq", algo.TokenBucket, 100, 3_600_000)
		d.Over, d.ElapsedMs = 10, 3_600_000
		seq++
		code, r, out := in.postAs(t, cred, &wire.Batch{Node: node, Seq: seq, Deltas: []wire.Delta{d}}, hdr...)
		if code != http.StatusOK {
			t.Fatalf("victim's batch %d: %d %s", i, code, out)
		}
		if st := r.States[0]; st.Flags&(wire.StateReplay|wire.StateRefused) != 0 {
			t.Fatalf("victim's batch %d answered as a replay or refused: %+v", i, st)
		}
	}
	if got := in.available(t, key); got != 0 {
		t.Fatalf("victim's key: %d available after 100 reported on 100, want 0 (reports taken for replays)", got)
	}
}

// TestAttackNodeTokens: an attacker holding node A's token cannot sync as node V: a
// batch naming V with a seq 9 minutes ahead (which, accepted, made V's real batches
// replays: 194 admitted on a limit of 100) is refused, and V's reports are charged
// exactly. Tokens for one node do not open another; the master secret itself is
// refused once node tokens are required.
func TestAttackNodeTokens(t *testing.T) {
	srv := redistest.StartStandalone(t)
	const master, oldMaster = "master-s3cret", "previous-master"
	strict := start(t, opts{addrs: srv.Addrs(), svc: func(c *Config) { c.SyncSecret, c.NodeTokensOnly = master, true }})
	strict.svc.SetSyncSecrets(master, oldMaster) // a rotation in progress
	upgrade := start(t, opts{addrs: srv.Addrs(), svc: func(c *Config) { c.SyncSecret = master }})
	pushRules(t, strict, `{"rules":[{"id":"seq","limit":100,"window":"1h"}]}`)
	eventually(t, 5*time.Second, "second instance's rules", func() bool { return upgrade.svc.Watcher().Version() == strict.svc.Watcher().Version() })

	victim, attacker := uniq("victim"), uniq("attacker")
	victimTok, attackerTok := issue(t, master, victim), issue(t, master, attacker)
	future := uint64(time.Now().Add(9 * time.Minute).UnixMicro())
	forged := func(key string) *wire.Batch {
		d := delta(key, "seq", algo.TokenBucket, 100, 3_600_000)
		return &wire.Batch{Node: victim, Seq: future, Deltas: []wire.Delta{d}}
	}
	// A token whose MAC is the attacker's but names the victim, and the attacker's token
	// with its node edited: both are someone else's signature.
	spliced := credential.Prefix + victim + attackerTok[strings.LastIndexByte(attackerTok, '.'):]

	tests := []struct {
		name string
		in   *instance
		cred string
		want int
	}{
		{"attacker's own token naming the victim", strict, attackerTok, http.StatusForbidden},
		{"attacker's MAC under the victim's name", strict, spliced, http.StatusUnauthorized},
		{"token of another master", strict, issue(t, "not-the-master", victim), http.StatusUnauthorized},
		{"master secret with node tokens only", strict, master, http.StatusUnauthorized},
		{"attacker's token, upgrade mode", upgrade, attackerTok, http.StatusForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := uniq("victim-key")
			code, _, out := tc.in.postAs(t, tc.cred, forged(key))
			if code != tc.want {
				t.Fatalf("forged batch: %d %s, want %d", code, out, tc.want)
			}
			chargeExactly(t, tc.in, victimTok, victim, key)
		})
	}

	t.Run("token of the old master during a rotation", func(t *testing.T) {
		node := uniq("rotating")
		chargeExactly(t, strict, issue(t, oldMaster, node), node, uniq("rot-key"))
	})

	t.Run("the attacker poisons only its own node", func(t *testing.T) {
		// Its own node's sequence is its to break: the future seq is accepted...
		key := uniq("own")
		if code, _, out := strict.postAs(t, attackerTok, &wire.Batch{Node: attacker, Seq: future,
			Deltas: []wire.Delta{delta(key, "seq", algo.TokenBucket, 100, 3_600_000)}}); code != http.StatusOK {
			t.Fatalf("attacker's own batch: %d %s", code, out)
		}
		// ...and the victim, on the same key, is charged exactly.
		chargeExactly(t, strict, victimTok, victim, key)
	})

	t.Run("upgrade mode: the master secret may name any node", func(t *testing.T) {
		// The previous release's gateways send the master secret itself: accepted as
		// whatever node they name, and counted, until --sync-node-tokens-only.
		before := metricValue(t, upgrade, `tollgate_sync_auth_total{mode="shared_secret"}`)
		chargeExactly(t, upgrade, master, uniq("legacy"), uniq("legacy-key"))
		if got := metricValue(t, upgrade, `tollgate_sync_auth_total{mode="shared_secret"}`); got != before+10 {
			t.Fatalf("shared_secret auths: %v → %v, want +10 (one per batch)", before, got)
		}
	})
}

// TestAttackMeshIdentity: under Istio the node is scoped by the mTLS peer's SPIFFE id,
// which the service's sidecar (a trusted proxy) passes in x-forwarded-client-cert. A
// peer of another service account naming the victim's node poisons only its own
// scope; an XFCC element the attacker prepends, or an XFCC sent from outside the
// trusted proxies, names nobody.
func TestAttackMeshIdentity(t *testing.T) {
	srv := redistest.StartStandalone(t)
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	mesh := start(t, opts{addrs: srv.Addrs(), svc: func(c *Config) {
		c.SyncSecret, c.Mesh = "", MeshIdentity{Enabled: true, TrustedProxies: loopback}
	}})
	elsewhere := start(t, opts{addrs: srv.Addrs(), svc: func(c *Config) {
		c.SyncSecret, c.Mesh = "", MeshIdentity{Enabled: true, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	}})
	pushRules(t, mesh, `{"rules":[{"id":"seq","limit":100,"window":"1h"}]}`)
	eventually(t, 5*time.Second, "second instance's rules", func() bool { return elsewhere.svc.Watcher().Version() == mesh.svc.Watcher().Version() })

	const victimID, attackerID = "spiffe://cluster.local/ns/gw/sa/victim", "spiffe://cluster.local/ns/gw/sa/attacker"
	xfcc := func(id string) string {
		return `By=spiffe://cluster.local/ns/tollgate/sa/tollgate;Hash=0123abcd;Subject="CN=a,O=b;c";URI=` + id
	}
	node := uniq("pod")
	future := uint64(time.Now().Add(9 * time.Minute).UnixMicro())

	t.Run("another service account naming the victim's node", func(t *testing.T) {
		key := uniq("mesh-key")
		b := &wire.Batch{Node: node, Seq: future, Deltas: []wire.Delta{delta(key, "seq", algo.TokenBucket, 100, 3_600_000)}}
		if code, _, out := mesh.postAs(t, "", b, XFCCHeader, xfcc(attackerID)); code != http.StatusOK {
			t.Fatalf("attacker's batch: %d %s (its own scope accepts it)", code, out)
		}
		chargeExactly(t, mesh, "", node, key, XFCCHeader, xfcc(victimID))
	})
	t.Run("an element the attacker prepends", func(t *testing.T) {
		// Envoy (APPEND_FORWARD) appends the peer it verified after whatever the client
		// sent: the last element is the one that counts.
		key := uniq("mesh-prepend")
		b := &wire.Batch{Node: node, Seq: future, Deltas: []wire.Delta{delta(key, "seq", algo.TokenBucket, 100, 3_600_000)}}
		if code, _, out := mesh.postAs(t, "", b, XFCCHeader, xfcc(victimID)+","+xfcc(attackerID)); code != http.StatusOK {
			t.Fatalf("attacker's batch: %d %s", code, out)
		}
		chargeExactly(t, mesh, "", node, key, XFCCHeader, xfcc(victimID))
	})
	t.Run("XFCC from outside the trusted proxies", func(t *testing.T) {
		b := &wire.Batch{Node: node, Seq: future, Deltas: []wire.Delta{delta(uniq("k"), "seq", algo.TokenBucket, 100, 3_600_000)}}
		if code, _, out := elsewhere.postAs(t, "", b, XFCCHeader, xfcc(victimID)); code != http.StatusUnauthorized {
			t.Fatalf("XFCC from an untrusted address: %d %s, want 401", code, out)
		}
	})
	t.Run("no XFCC and no credential", func(t *testing.T) {
		b := &wire.Batch{Node: node, Seq: future, Deltas: []wire.Delta{delta(uniq("k"), "seq", algo.TokenBucket, 100, 3_600_000)}}
		if code, _, out := mesh.postAs(t, "", b); code != http.StatusUnauthorized {
			t.Fatalf("no identity: %d %s, want 401", code, out)
		}
	})
}

func TestLastXFCCURI(t *testing.T) {
	tests := []struct {
		name, in, want string
		ok             bool
	}{
		{"one element", `By=spiffe://a/b;URI=spiffe://cluster.local/ns/x/sa/y`, "spiffe://cluster.local/ns/x/sa/y", true},
		{"quoted subject with separators", `Subject="CN=a,OU=b;c=\"d\"";URI=spiffe://td/ns/x/sa/y`, "spiffe://td/ns/x/sa/y", true},
		{"last element wins", `URI=spiffe://td/ns/x/sa/victim,URI=spiffe://td/ns/x/sa/real`, "spiffe://td/ns/x/sa/real", true},
		{"quoted URI", `URI="spiffe://td/ns/x/sa/y"`, "spiffe://td/ns/x/sa/y", true},
		{"no URI", `By=spiffe://td/ns/x/sa/y;Hash=00`, "", false},
		{"not a SPIFFE id", `URI=https://example.com/`, "", false},
		{"last element without URI", `URI=spiffe://td/ns/x/sa/y,Hash=00`, "", false},
		{"space in the id", `URI="spiffe://td/ns/x y"`, "", false},
		{"empty", ``, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := lastXFCCURI(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("lastXFCCURI(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func FuzzLastXFCCURI(f *testing.F) {
	f.Add(`By=spiffe://a;Subject="x,y;z";URI=spiffe://td/ns/a/sa/b`)
	f.Add(`"\`)
	f.Fuzz(func(t *testing.T, v string) {
		if id, ok := lastXFCCURI(v); ok && (!strings.HasPrefix(id, "spiffe://") || credential.ValidNode(id) != "") {
			t.Fatalf("lastXFCCURI(%q) = %q", v, id)
		}
	})
}
