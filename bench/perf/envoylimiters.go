package perf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/wasmbuild"
)

// Limiter is one way of rate limiting in the same Envoy that the real-Envoy comparison
// measures (BENCHMARKS.md, "Tollgate in Envoy against Envoy's own rate limiting").
type Limiter int

// The limiters, in the order the report lists them.
const (
	PassThrough    Limiter = iota // no rate limiting: the shipped envoy.yaml without the Wasm filter
	LocalRateLimit                // envoy.filters.http.local_ratelimit, one token bucket per x-api-key
	TollgateLocal                 // the filter without a sync block: local buckets only
	TollgateSynced                // the filter synced to the service and Redis, as shipped
	RLSPath                       // envoy.filters.http.ratelimit calling the service's gRPC RLS
	FloorModule                   // the floor module: only the host calls a decision cannot avoid
)

// Limiters are all of them.
var Limiters = []Limiter{PassThrough, LocalRateLimit, TollgateLocal, TollgateSynced, RLSPath, FloorModule}

func (l Limiter) String() string {
	switch l {
	case PassThrough:
		return "pass-through (no rate limiting)"
	case LocalRateLimit:
		return "Envoy local_ratelimit, per x-api-key"
	case TollgateLocal:
		return "Tollgate, local only (no sync)"
	case TollgateSynced:
		return "Tollgate, synced (service + Redis)"
	case RLSPath:
		return "Envoy ratelimit filter → Tollgate RLS"
	case FloorModule:
		return "floor module (unavoidable host calls)"
	}
	return "limiter " + strconv.Itoa(int(l))
}

// Short is the limiter's name in charts.
func (l Limiter) Short() string {
	return [...]string{"pass-through", "local_ratelimit", "Tollgate local", "Tollgate synced", "ratelimit→RLS", "floor module"}[l]
}

// Wasm says whether the limiter runs a Wasm module.
func (l Limiter) Wasm() bool { return l == TollgateLocal || l == TollgateSynced || l == FloorModule }

// Remote says whether the limiter's requests reach the service and Redis.
func (l Limiter) Remote() bool { return l == TollgateSynced || l == RLSPath }

// CompareLimit is the one rule every limiter enforces: a token bucket of CompareLimit
// requests per second per caller (x-api-key). The load never reaches it, so every
// limiter admits every request and the comparison is of the decision's path, not of
// refusals.
const CompareLimit = 1000

// CompareDomain is the RLS domain of the rule (deploy/envoy-rls.yaml's).
const CompareDomain = "tollgate"

// compareRule is the rule as the Wasm filter and the service read it: matched by path
// for the filter, by descriptor for the RLS.
func compareRule() map[string]any {
	return map[string]any{
		"id": "bench", "match": map[string]any{"prefix": "/"}, "algorithm": "token_bucket",
		"limit": CompareLimit, "window": "1s",
		"descriptors": map[string]any{"domain": CompareDomain, "entries": []any{map[string]any{"key": "api_key"}}},
	}
}

// CompareRules is the service's rule set: the filter synced with the service installs it
// too, so both paths decide the same rule on the same Redis buckets.
func CompareRules() []byte {
	b, _ := json.Marshal(map[string]any{
		"version": 1,
		"key":     map[string]any{"source": "header", "name": "x-api-key"},
		"rules":   []any{compareRule()},
	})
	return b
}

// LimiterConfig turns the shipped envoy.yaml, its addresses substituted
// (envoyproc.ShippedConfig), into l's bootstrap: the Wasm filter's rule set replaced by
// the comparison's rule (its sync block kept for TollgateSynced, dropped for
// TollgateLocal), or the Wasm filter replaced by local_ratelimit or by the ratelimit
// filter and cluster of deploy/envoy-rls.yaml (rlsPort the service's gRPC port), or cut
// out. Everything else — listener, access log, router, clusters — is the shipped file's,
// so the comparison measures what users run.
func LimiterConfig(l Limiter, cfg []byte, rlsPort int) ([]byte, error) {
	switch l {
	case PassThrough:
		return withoutWasmFilter(cfg)
	case TollgateLocal, TollgateSynced, FloorModule:
		return withFilterRules(cfg, l == TollgateSynced)
	case LocalRateLimit:
		return replaceWasmFilter(cfg, localRateLimitFilter)
	case RLSPath:
		return withRLS(cfg, rlsPort)
	}
	return nil, fmt.Errorf("limiter %d: no configuration", l)
}

// localRateLimitFilter is Envoy's local rate limit with one token bucket per x-api-key
// value: the descriptor entry with an empty value matches any value and gets a bucket of
// its own (dynamic descriptors, an LRU of max_dynamic_descriptors buckets). The default
// bucket is not consumed by requests that match the descriptor. The X-RateLimit headers
// are on, as the Wasm filter's RateLimit headers are.
var localRateLimitFilter = `          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: http_local_rate_limiter
              token_bucket: {max_tokens: LIMIT, tokens_per_fill: LIMIT, fill_interval: 1s}
              filter_enabled:
                runtime_key: local_rate_limit_enabled
                default_value: {numerator: 100, denominator: HUNDRED}
              filter_enforced:
                runtime_key: local_rate_limit_enforced
                default_value: {numerator: 100, denominator: HUNDRED}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              always_consume_default_token_bucket: false
              max_dynamic_descriptors: 100000
              rate_limits:
              - actions:
                - request_headers: {header_name: x-api-key, descriptor_key: api_key}
              descriptors:
              - entries:
                - key: api_key
                  value: ""
                token_bucket: {max_tokens: LIMIT, tokens_per_fill: LIMIT, fill_interval: 1s}
`

func init() {
	localRateLimitFilter = strings.ReplaceAll(localRateLimitFilter, "LIMIT", strconv.Itoa(CompareLimit))
}

const (
	wasmFilterLine   = "          - name: envoy.filters.http.wasm\n"
	routerFilterLine = "          - name: envoy.filters.http.router\n"
)

// replaceWasmFilter puts filter (YAML at the http_filters' indentation) where the Wasm
// filter was.
func replaceWasmFilter(cfg []byte, filter string) ([]byte, error) {
	start := bytes.Index(cfg, []byte(wasmFilterLine))
	end := bytes.Index(cfg, []byte(routerFilterLine))
	if start < 0 || end < start {
		return nil, fmt.Errorf("envoy.yaml: no wasm filter before the router")
	}
	out := append([]byte(nil), cfg[:start]...)
	out = append(out, filter...)
	return append(out, cfg[end:]...), nil
}

// withFilterRules replaces the Wasm filter's configuration (the JSON block after
// "value: |") with the shipped one's settings and the comparison's key and rule, the
// sync block kept or dropped.
func withFilterRules(cfg []byte, sync bool) ([]byte, error) {
	const opener = "value: |\n"
	i := bytes.Index(cfg, []byte(opener))
	end := bytes.Index(cfg, []byte(routerFilterLine))
	if i < 0 || end < i {
		return nil, fmt.Errorf("envoy.yaml: no filter configuration block before the router")
	}
	i += len(opener)
	block := string(cfg[i:end])
	indent := len(block) - len(strings.TrimLeft(block, " "))
	var doc map[string]any
	if err := json.Unmarshal([]byte(block), &doc); err != nil {
		return nil, fmt.Errorf("envoy.yaml: the filter configuration: %w", err)
	}
	for _, k := range []string{"allow", "deny", "tiers", "rules"} {
		delete(doc, k)
	}
	if !sync {
		delete(doc, "sync")
	} else if _, ok := doc["sync"]; !ok {
		return nil, fmt.Errorf("envoy.yaml: the filter configuration has no sync block")
	}
	doc["key"] = map[string]any{"source": "header", "name": "x-api-key"}
	doc["rules"] = []any{compareRule()}
	js, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	pad := strings.Repeat(" ", indent)
	var b strings.Builder
	for _, line := range strings.Split(string(js), "\n") {
		b.WriteString(pad + line + "\n")
	}
	out := append([]byte(nil), cfg[:i]...)
	out = append(out, b.String()...)
	return append(out, cfg[end:]...), nil
}

// withRLS is the Envoy of deploy/envoy-rls.yaml built on the shipped file: its ratelimit
// filter in place of the Wasm filter, its virtual host's rate_limits actions, its
// tollgate_rls cluster (on rlsPort), the sync secret as the service's credential.
func withRLS(cfg []byte, rlsPort int) ([]byte, error) {
	root, err := wasmbuild.RepoRoot()
	if err != nil {
		return nil, err
	}
	rls, err := os.ReadFile(filepath.Join(root, "deploy", "envoy-rls.yaml"))
	if err != nil {
		return nil, err
	}
	return rlsFrom(cfg, rls, rlsPort)
}

// rlsFrom takes the parts of rls (deploy/envoy-rls.yaml) into cfg.
func rlsFrom(cfg, rls []byte, rlsPort int) ([]byte, error) {
	cut := func(from, to string) (string, error) {
		i := bytes.Index(rls, []byte(from))
		if i < 0 {
			return "", fmt.Errorf("deploy/envoy-rls.yaml: no %q", strings.TrimSpace(from))
		}
		if to == "" {
			return string(rls[i:]), nil
		}
		j := bytes.Index(rls[i:], []byte(to))
		if j < 0 {
			return "", fmt.Errorf("deploy/envoy-rls.yaml: no %q after %q", strings.TrimSpace(to), strings.TrimSpace(from))
		}
		return string(rls[i : i+j]), nil
	}
	filter, err := cut("          - name: envoy.filters.http.ratelimit\n", routerFilterLine)
	if err != nil {
		return nil, err
	}
	// The virtual host's actions, up to its routes (the route-level ones of /search are
	// not taken: the comparison's one rule is the per-key one).
	actions, err := cut("              rate_limits:\n", "              routes:\n")
	if err != nil {
		return nil, err
	}
	var keep []string
	for _, l := range strings.SplitAfter(actions, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			keep = append(keep, l)
		}
	}
	actions = strings.Join(keep, "")
	cluster, err := cut("  - name: tollgate_rls\n", "")
	if err != nil {
		return nil, err
	}
	for _, r := range []struct {
		s         *string
		old, new_ string
	}{
		{&filter, "REPLACE-with-the-content-of-/etc/tollgate/sync-secret", SyncSecret},
		{&cluster, "port_value: 8083}", "port_value: " + strconv.Itoa(rlsPort) + "}"},
	} {
		if strings.Count(*r.s, r.old) != 1 {
			return nil, fmt.Errorf("deploy/envoy-rls.yaml: %q occurs %d times, want once", r.old, strings.Count(*r.s, r.old))
		}
		*r.s = strings.Replace(*r.s, r.old, r.new_, 1)
	}
	out, err := replaceWasmFilter(cfg, filter)
	if err != nil {
		return nil, err
	}
	const domains = "              domains: [\"*\"]\n"
	if bytes.Count(out, []byte(domains)) != 1 {
		return nil, fmt.Errorf("envoy.yaml: want one virtual host")
	}
	out = bytes.Replace(out, []byte(domains), []byte(domains+actions), 1)
	out = append(bytes.TrimRight(out, "\n"), "\n\n"...)
	return append(out, cluster...), nil
}
