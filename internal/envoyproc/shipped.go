package envoyproc

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Shipped are the substitutions ShippedConfig and GRPCServiceConfig make in the
// repository's Envoy bootstraps: addresses, ports and paths only, so a test runs the
// bootstrap users copy.
type Shipped struct {
	Listener   int    // the ingress listener's port (the files' 10000), on 127.0.0.1
	Backend    int    // the backend cluster's port (8080)
	Sync       int    // the sync service's port (envoy.yaml's 8081)
	GRPC       int    // the gRPC rate limit service's port (envoy-rls.yaml's and envoy-rlqs.yaml's 8083)
	Wasm       string // the module's path (envoy.yaml's /etc/envoy/filter.wasm)
	SyncSecret string // one of the service's sync secrets (the files' placeholder)
}

// ShippedConfig returns envoy.yaml with s substituted and the admin port left to Envoy
// (0; Start reads it back). Each original must occur in the file: a bootstrap that no
// longer has it is an error, not a silently unsubstituted run.
func ShippedConfig(yaml []byte, s Shipped) ([]byte, error) {
	return substitute("envoy.yaml", yaml, s.common(
		[2]string{"address: 127.0.0.1, port_value: 8081}", "address: 127.0.0.1, port_value: " + strconv.Itoa(s.Sync) + "}"},
		[2]string{"filename: /etc/envoy/filter.wasm", "filename: " + strconv.Quote(s.Wasm)}))
}

// GRPCServiceConfig is ShippedConfig for the bootstraps that call the service over gRPC
// (name: envoy-rls.yaml, the ratelimit filter, or envoy-rlqs.yaml, rate_limit_quota),
// read from the repository at root (its deploy directory): listener, backend, the
// service's gRPC port and the sync secret.
func GRPCServiceConfig(root, name string, s Shipped) ([]byte, error) {
	yaml, err := os.ReadFile(filepath.Join(root, "deploy", name))
	if err != nil {
		return nil, err
	}
	return substitute(name, yaml, s.common(
		[2]string{"address: 127.0.0.1, port_value: 8083}", "address: 127.0.0.1, port_value: " + strconv.Itoa(s.GRPC) + "}"}))
}

// common adds the substitutions every shipped bootstrap takes to more.
func (s Shipped) common(more ...[2]string) [][2]string {
	return append([][2]string{
		{"address: 127.0.0.1, port_value: 9901}", "address: 127.0.0.1, port_value: 0}"},
		{"address: 0.0.0.0, port_value: 10000}", "address: 127.0.0.1, port_value: " + strconv.Itoa(s.Listener) + "}"},
		{"address: 127.0.0.1, port_value: 8080}", "address: 127.0.0.1, port_value: " + strconv.Itoa(s.Backend) + "}"},
		{"REPLACE-with-the-content-of-/etc/tollgate/sync-secret", s.SyncSecret},
	}, more...)
}

// substitute replaces each pair's original in the bootstrap name, where it must occur
// exactly once.
func substitute(name string, yaml []byte, pairs [][2]string) ([]byte, error) {
	for _, r := range pairs {
		if n := bytes.Count(yaml, []byte(r[0])); n != 1 {
			return nil, fmt.Errorf("%s: %q occurs %d times, want once", name, r[0], n)
		}
		yaml = bytes.Replace(yaml, []byte(r[0]), []byte(r[1]), 1)
	}
	return yaml, nil
}
