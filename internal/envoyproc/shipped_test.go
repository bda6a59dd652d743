package envoyproc

import (
	"os"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// The repository's envoy.yaml takes every substitution, and nothing else changes; a
// bootstrap that lost one of the originals is refused.
func TestShippedConfig(t *testing.T) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	yaml, err := os.ReadFile(root + "/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := Shipped{Listener: 20000, Backend: 20001, Sync: 20002, Wasm: "/tmp/x/filter.wasm", SyncSecret: "s3cret"}
	got, err := ShippedConfig(yaml, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"port_value: 0}", "address: 127.0.0.1, port_value: 20000}", "port_value: 20001}",
		"port_value: 20002}", `filename: "/tmp/x/filter.wasm"`, `"secret": "s3cret"`} {
		if !strings.Contains(string(got), want) {
			t.Errorf("substituted config lacks %q", want)
		}
	}
	if d := len(strings.Split(string(got), "\n")) - len(strings.Split(string(yaml), "\n")); d != 0 {
		t.Errorf("substitution changed the line count by %d", d)
	}
	for _, drop := range []string{"port_value: 8081}", "filename: /etc/envoy/filter.wasm"} {
		if _, err := ShippedConfig([]byte(strings.Replace(string(yaml), drop, "", 1)), s); err == nil {
			t.Errorf("a bootstrap without %q was accepted", drop)
		}
	}
}
