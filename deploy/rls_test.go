package deploy

import (
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

const envoyRLSFile = "envoy-rls.yaml"

// rlsRules is the rule set envoy-rls.yaml's comment gives for its actions.
const rlsRules = `{"rules": [
  {"id": "plan", "limit": 100, "window": "1m", "match": {"prefix": "/"},
   "descriptors": {"domain": "tollgate", "entries": [{"key": "api_key"}]}},
  {"id": "search", "limit": 30, "window": "1m",
   "descriptors": {"domain": "tollgate", "entries": [{"key": "route", "value": "search"}, {"key": "api_key"}]}}
]}`

func TestEnvoyRLSYAML(t *testing.T) {
	data := readFile(t, envoyRLSFile)
	e, err := CheckEnvoyRLS(data)
	if err != nil {
		t.Fatal(err)
	}
	if e.Filter.GetDomain() != "tollgate" || e.Filter.GetFailureModeDeny() {
		t.Errorf("domain %q failure_mode_deny %v, want tollgate and false", e.Filter.GetDomain(), e.Filter.GetFailureModeDeny())
	}
	if port := e.Cluster.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8083 {
		t.Errorf("rate limit service port %d, want 8083 (the README's --rls-listen)", port)
	}
	var auth string
	for _, md := range e.Filter.GetRateLimitService().GetGrpcService().GetInitialMetadata() {
		if md.GetKey() == "authorization" {
			auth = md.GetValue()
		}
	}
	if !strings.HasPrefix(auth, "Bearer ") {
		t.Errorf("initial_metadata authorization %q, want the sync secret as a bearer", auth)
	}
	// Every action list must build a descriptor that a rule of the documented rule set
	// selects, or the service would answer it OK without limiting anything.
	cfg, err := rule.Parse([]byte(rlsRules))
	if err != nil {
		t.Fatal(err)
	}
	for i, rl := range e.RateLimits {
		var entries []rule.DescriptorEntry
		for _, a := range rl.GetActions() {
			switch {
			case a.GetGenericKey() != nil:
				entries = append(entries, rule.DescriptorEntry{Key: a.GetGenericKey().GetDescriptorKey(), Value: a.GetGenericKey().GetDescriptorValue()})
			case a.GetRequestHeaders() != nil:
				entries = append(entries, rule.DescriptorEntry{Key: a.GetRequestHeaders().GetDescriptorKey(), Value: "sk_example"})
			default:
				t.Fatalf("rate_limits[%d]: an action this test does not model: %v", i, a)
			}
		}
		if got := cfg.ApplyDescriptor(e.Filter.GetDomain(), entries, nil); len(got) != 1 || got[0].Key != "sk_example" {
			t.Errorf("rate_limits[%d] builds %v: selects %d rules, want 1 keyed by the API key", i, entries, len(got))
		}
	}
}

// TestEnvoyRLSRejects: each mistake envoy-rls.yaml could make is caught.
func TestEnvoyRLSRejects(t *testing.T) {
	good := string(readFile(t, envoyRLSFile))
	for _, tt := range []struct{ name, old, new, want string }{
		{"HTTP/1.1 to the service", "          http2_protocol_options: {}\n", "          http_protocol_options: {}\n", "must speak HTTP/2"},
		{"unknown cluster", "envoy_grpc: {cluster_name: tollgate_rls}", "envoy_grpc: {cluster_name: tollgate}", `cluster "tollgate" is not a cluster`},
		{"v2 transport", "transport_api_version: V3", "transport_api_version: AUTO", "must be V3"},
		{"no domain", "              domain: tollgate\n", "", "RateLimit.Domain: value length must be at least 1"},
		{"unknown field", "request_type: external", "request_typ: external", "request_typ"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(good, tt.old) {
				t.Fatalf("envoy-rls.yaml no longer contains %q", tt.old)
			}
			_, err := CheckEnvoyRLS([]byte(strings.Replace(good, tt.old, tt.new, 1)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
