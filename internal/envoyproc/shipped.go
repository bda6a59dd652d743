package envoyproc

import (
	"bytes"
	"fmt"
	"strconv"
)

// Shipped are the substitutions ShippedConfig makes in the repository's envoy.yaml:
// addresses, ports and paths only, so a test runs the bootstrap users copy.
type Shipped struct {
	Listener   int    // the ingress listener's port (the file's 10000), on 127.0.0.1
	Backend    int    // the backend cluster's port (8080)
	Sync       int    // the sync service's port (8081)
	Wasm       string // the module's path (/etc/envoy/filter.wasm)
	SyncSecret string // one of the service's sync secrets (the file's placeholder)
}

// ShippedConfig returns envoy.yaml with s substituted and the admin port left to Envoy
// (0; Start reads it back). Each original must occur in the file: a bootstrap that no
// longer has it is an error, not a silently unsubstituted run.
func ShippedConfig(yaml []byte, s Shipped) ([]byte, error) {
	for _, r := range []struct{ old, new string }{
		{"address: 127.0.0.1, port_value: 9901}", "address: 127.0.0.1, port_value: 0}"},
		{"address: 0.0.0.0, port_value: 10000}", "address: 127.0.0.1, port_value: " + strconv.Itoa(s.Listener) + "}"},
		{"address: 127.0.0.1, port_value: 8080}", "address: 127.0.0.1, port_value: " + strconv.Itoa(s.Backend) + "}"},
		{"address: 127.0.0.1, port_value: 8081}", "address: 127.0.0.1, port_value: " + strconv.Itoa(s.Sync) + "}"},
		{"filename: /etc/envoy/filter.wasm", "filename: " + strconv.Quote(s.Wasm)},
		{"REPLACE-with-the-content-of-/etc/tollgate/sync-secret", s.SyncSecret},
	} {
		if bytes.Count(yaml, []byte(r.old)) != 1 {
			return nil, fmt.Errorf("envoy.yaml: %q occurs %d times, want once", r.old, bytes.Count(yaml, []byte(r.old)))
		}
		yaml = bytes.Replace(yaml, []byte(r.old), []byte(r.new), 1)
	}
	return yaml, nil
}
