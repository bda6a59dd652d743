// Package deploy checks Tollgate's deployment manifests — envoy.yaml (an Envoy v3
// bootstrap) and plugin.yaml (an Istio WasmPlugin and the traffic policy for the sync
// service) at the repository root — against the proxies' own API types, the way the
// proxies will read them: unknown fields are errors, Envoy's protoc-gen-validate rules
// apply (inside every typed_config too), and the rule set the filter receives must pass
// rule.Parse. Envoy itself runs envoy.yaml in the end-to-end suite (two releases), but
// Istio and Kubernetes cannot be installed where Tollgate is built and tested, and a
// schema check names the field at fault: without this a typo in a manifest would surface
// only at rollout, as a proxy that refuses its configuration.
//
// What the proxies check beyond their schemas (listener ports free, Kubernetes
// admission, Istio's own validation webhook) is not checked here.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	filelogv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	extensionsv1alpha1 "istio.io/api/extensions/v1alpha1"
	networkingv1 "istio.io/api/networking/v1"
	securityv1beta1 "istio.io/api/security/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

// RootID is the root_id the Tollgate filter runs under (Envoy's config.root_id, Istio's
// pluginName); CheckEnvoy finds the Tollgate filter among the bootstrap's Wasm filters by it.
const RootID = "tollgate"

// strict is how both proxies read their configuration: an unknown field is an error.
// A typed_config's "@type" resolves through the global registry, which holds only the
// linked packages: the imports above (HCM, router, Wasm, the file access log) are what
// envoy.yaml uses.
var strict = protojson.UnmarshalOptions{DiscardUnknown: false}

// The file access logger's types resolve only when its package is linked.
var _ = filelogv3.FileAccessLog{}

// Envoy is what CheckEnvoy found in a bootstrap.
type Envoy struct {
	Bootstrap *bootstrapv3.Bootstrap
	Filter    *wasmfilterv3.Wasm // the Tollgate filter's typed_config
	RulesJSON []byte             // the plugin configuration the filter receives
	Rules     *rule.Config
}

// readBootstrap reads an Envoy v3 bootstrap (YAML or JSON) strictly — unknown fields
// fail — and validates it and every typed_config in it.
func readBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := strict.Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	if err := validateTree(b, 0); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	return b, nil
}

// CheckEnvoy reads an Envoy v3 bootstrap (YAML or JSON) strictly, validates it and
// every typed_config in it, finds the Tollgate Wasm filter (root_id RootID) and parses
// its plugin configuration with rule.Parse. It also checks what Envoy would only
// discover at run time: the filter sits before the router, its VM has a vm_id (shared
// data, and so one quota for all worker threads, is scoped by it), and sync.cluster and
// every route name a cluster the bootstrap defines.
func CheckEnvoy(data []byte) (*Envoy, error) {
	b, err := readBootstrap(data)
	if err != nil {
		return nil, err
	}
	clusters := make(map[string]bool)
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
	}
	var found []*wasmfilterv3.Wasm
	for _, l := range b.GetStaticResources().GetListeners() {
		chains := l.GetFilterChains()
		if dc := l.GetDefaultFilterChain(); dc != nil {
			chains = append(chains[:len(chains):len(chains)], dc)
		}
		for _, fc := range chains {
			w, err := checkFilterChain(l.GetName(), fc, clusters)
			if err != nil {
				return nil, err
			}
			found = append(found, w...)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("envoy bootstrap: want exactly one envoy.filters.http.wasm filter with root_id %q, found %d", RootID, len(found))
	}
	e := &Envoy{Bootstrap: b, Filter: found[0]}
	cfg := e.Filter.GetConfig()
	vm := cfg.GetVmConfig()
	switch {
	case vm == nil:
		return nil, errors.New("envoy bootstrap: the tollgate filter has no vm_config")
	case vm.GetVmId() == "":
		return nil, errors.New("envoy bootstrap: the tollgate filter's vm_config.vm_id is empty: shared data, where every worker thread's VM keeps the buckets, is scoped by vm_id; name it so no other Wasm module shares that scope")
	case vm.GetRuntime() == "":
		return nil, errors.New("envoy bootstrap: the tollgate filter's vm_config.runtime is empty")
	case vm.GetCode().GetLocal().GetFilename() == "" && vm.GetCode().GetRemote() == nil:
		return nil, errors.New("envoy bootstrap: the tollgate filter's vm_config.code names no local file or remote source")
	}
	if e.RulesJSON, err = pluginJSON(cfg.GetConfiguration()); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: the tollgate filter's configuration: %w", err)
	}
	if e.Rules, err = rule.Parse(e.RulesJSON); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: the tollgate filter's configuration: %w", err)
	}
	if c := e.Rules.Sync.Cluster; c != "" && !clusters[c] {
		return nil, fmt.Errorf("envoy bootstrap: sync.cluster %q is not a cluster of static_resources", c)
	}
	return e, nil
}

// checkFilterChain returns the Tollgate filters of one filter chain's HTTP connection
// managers, checking their order and their routes' clusters on the way.
func checkFilterChain(listener string, fc *listenerv3.FilterChain, clusters map[string]bool) ([]*wasmfilterv3.Wasm, error) {
	var found []*wasmfilterv3.Wasm
	for _, nf := range fc.GetFilters() {
		if !nf.GetTypedConfig().MessageIs(&hcmv3.HttpConnectionManager{}) {
			continue
		}
		hcm := &hcmv3.HttpConnectionManager{}
		if err := nf.GetTypedConfig().UnmarshalTo(hcm); err != nil {
			return nil, fmt.Errorf("envoy bootstrap: listener %q: %w", listener, err)
		}
		if err := checkRoutes(listener, hcm.GetRouteConfig(), clusters); err != nil {
			return nil, err
		}
		filters := hcm.GetHttpFilters()
		for i, hf := range filters {
			if !hf.GetTypedConfig().MessageIs(&wasmfilterv3.Wasm{}) {
				continue
			}
			w := &wasmfilterv3.Wasm{}
			if err := hf.GetTypedConfig().UnmarshalTo(w); err != nil {
				return nil, fmt.Errorf("envoy bootstrap: listener %q: http filter %q: %w", listener, hf.GetName(), err)
			}
			if w.GetConfig().GetRootId() != RootID {
				continue
			}
			if i == len(filters)-1 || !filters[len(filters)-1].GetTypedConfig().MessageIs(&routerv3.Router{}) {
				return nil, fmt.Errorf("envoy bootstrap: listener %q: the tollgate filter must come before envoy.filters.http.router, the last HTTP filter", listener)
			}
			found = append(found, w)
		}
	}
	return found, nil
}

// checkRoutes fails on a route to a cluster the bootstrap does not define (Envoy refuses
// such a static route configuration at start).
func checkRoutes(listener string, rc *routev3.RouteConfiguration, clusters map[string]bool) error {
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			names := []string{r.GetRoute().GetCluster()}
			for _, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
				names = append(names, wc.GetName())
			}
			for _, n := range names {
				if n != "" && !clusters[n] {
					return fmt.Errorf("envoy bootstrap: listener %q: virtual host %q routes to undefined cluster %q", listener, vh.GetName(), n)
				}
			}
		}
	}
	return nil
}

// pluginJSON returns the bytes the filter receives from proxy_get_buffer_bytes for its
// plugin configuration: Envoy passes a StringValue's or BytesValue's content as is and
// serialises a Struct to JSON.
func pluginJSON(a *anypb.Any) ([]byte, error) {
	if a == nil {
		return nil, errors.New("missing (the filter would start with no rules)")
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	switch v := m.(type) {
	case *wrapperspb.StringValue:
		return []byte(v.GetValue()), nil
	case *wrapperspb.BytesValue:
		return v.GetValue(), nil
	case *structpb.Struct:
		return protojson.Marshal(v)
	}
	return nil, fmt.Errorf("type %s: want google.protobuf.StringValue, BytesValue or Struct", a.GetTypeUrl())
}

// maxAnyDepth bounds validateTree's descent through nested typed_configs.
const maxAnyDepth = 8

// validateTree runs the protoc-gen-validate rules of m and of every message packed in an
// Any inside it: generated ValidateAll stops at an Any, and Envoy's configuration is
// mostly typed_config.
func validateTree(m proto.Message, depth int) error {
	if depth > maxAnyDepth {
		return fmt.Errorf("typed_config nested deeper than %d levels", maxAnyDepth)
	}
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return err
		}
	}
	return protorange.Range(m.ProtoReflect(), func(p protopath.Values) error {
		if len(p.Values) < 2 {
			return nil // the root itself
		}
		msg, ok := p.Index(-1).Value.Interface().(protoreflect.Message)
		if !ok {
			return nil
		}
		a, ok := msg.Interface().(*anypb.Any)
		if !ok {
			return nil
		}
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %w", p.Path[1:], err)
		}
		if err := validateTree(inner, depth+1); err != nil {
			return fmt.Errorf("%s (%s): %w", p.Path[1:], a.GetTypeUrl(), err)
		}
		return nil
	})
}

// Object is the Kubernetes envelope of one manifest document.
type Object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	RawSpec json.RawMessage `json:"spec"`
}

// Resource is one document of an Istio manifest: its envelope and its spec read into
// Istio's API type.
type Resource struct {
	Object
	Spec proto.Message
}

// Istio is what CheckIstio found in a manifest.
type Istio struct {
	Resources        []Resource
	Plugin           *extensionsv1alpha1.WasmPlugin
	DestinationRules []*networkingv1.DestinationRule
	ServiceEntries   []*networkingv1.ServiceEntry
	// AuthorizationPolicies and PeerAuthentications guard the sync service when gateways
	// reach it over Istio mTLS instead of with a sync secret.
	AuthorizationPolicies []*securityv1beta1.AuthorizationPolicy
	PeerAuthentications   []*securityv1beta1.PeerAuthentication
	RulesJSON             []byte // pluginConfig as the filter receives it (JSON)
	Rules                 *rule.Config
	// SyncHost and SyncPort are parsed from sync.cluster (outbound|port|subset|host).
	SyncHost string
	SyncPort int
}

// istioKinds maps apiVersion/kind to the API type of the spec. The networking kinds are
// served at three versions with one schema.
var istioKinds = map[string]func() proto.Message{
	"extensions.istio.io/v1alpha1/WasmPlugin":       func() proto.Message { return &extensionsv1alpha1.WasmPlugin{} },
	"networking.istio.io/v1/DestinationRule":        func() proto.Message { return &networkingv1.DestinationRule{} },
	"networking.istio.io/v1beta1/DestinationRule":   func() proto.Message { return &networkingv1.DestinationRule{} },
	"networking.istio.io/v1alpha3/DestinationRule":  func() proto.Message { return &networkingv1.DestinationRule{} },
	"networking.istio.io/v1/ServiceEntry":           func() proto.Message { return &networkingv1.ServiceEntry{} },
	"networking.istio.io/v1beta1/ServiceEntry":      func() proto.Message { return &networkingv1.ServiceEntry{} },
	"networking.istio.io/v1alpha3/ServiceEntry":     func() proto.Message { return &networkingv1.ServiceEntry{} },
	"security.istio.io/v1/AuthorizationPolicy":      func() proto.Message { return &securityv1beta1.AuthorizationPolicy{} },
	"security.istio.io/v1beta1/AuthorizationPolicy": func() proto.Message { return &securityv1beta1.AuthorizationPolicy{} },
	"security.istio.io/v1/PeerAuthentication":       func() proto.Message { return &securityv1beta1.PeerAuthentication{} },
	"security.istio.io/v1beta1/PeerAuthentication":  func() proto.Message { return &securityv1beta1.PeerAuthentication{} },
}

// istioCluster is the outbound cluster name Istio generates for a service port
// (pilot/pkg/model BuildSubsetKey): outbound|<port>|<subset>|<hostname>.
var istioCluster = regexp.MustCompile(`^outbound\|([0-9]{1,5})\|([A-Za-z0-9_.-]*)\|([a-z0-9.-]+)$`)

// dnsName is a Kubernetes object name (DNS-1123 subdomain).
var dnsName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// CheckIstio reads a multi-document Istio manifest: every document must be a WasmPlugin,
// DestinationRule, ServiceEntry, AuthorizationPolicy or PeerAuthentication whose spec unmarshals into Istio's API type with no
// unknown field (and with the camelCase names Kubernetes accepts), and exactly one must
// be a WasmPlugin whose pluginConfig, as the filter receives it, passes rule.Parse. Its
// sync.cluster must be an outbound cluster name as Istio generates it; a subset in it
// must be defined by a DestinationRule of the manifest.
func CheckIstio(data []byte) (*Istio, error) {
	docs := splitDocuments(data)
	is := &Istio{}
	for i, doc := range docs {
		res, err := readResource(doc)
		if err != nil {
			return nil, fmt.Errorf("istio manifest: document %d: %w", i+1, err)
		}
		if res == nil {
			continue // empty or comments only
		}
		is.Resources = append(is.Resources, *res)
		switch spec := res.Spec.(type) {
		case *extensionsv1alpha1.WasmPlugin:
			if is.Plugin != nil {
				return nil, fmt.Errorf("istio manifest: document %d: a second WasmPlugin", i+1)
			}
			is.Plugin = spec
		case *networkingv1.DestinationRule:
			if spec.GetHost() == "" {
				return nil, fmt.Errorf("istio manifest: document %d: DestinationRule %q: spec.host is required", i+1, res.Metadata.Name)
			}
			is.DestinationRules = append(is.DestinationRules, spec)
		case *networkingv1.ServiceEntry:
			if len(spec.GetHosts()) == 0 {
				return nil, fmt.Errorf("istio manifest: document %d: ServiceEntry %q: spec.hosts is required", i+1, res.Metadata.Name)
			}
			is.ServiceEntries = append(is.ServiceEntries, spec)
		case *securityv1beta1.AuthorizationPolicy:
			is.AuthorizationPolicies = append(is.AuthorizationPolicies, spec)
		case *securityv1beta1.PeerAuthentication:
			is.PeerAuthentications = append(is.PeerAuthentications, spec)
		}
	}
	if is.Plugin == nil {
		return nil, errors.New("istio manifest: no WasmPlugin")
	}
	if err := is.checkPlugin(); err != nil {
		return nil, fmt.Errorf("istio manifest: WasmPlugin: %w", err)
	}
	return is, nil
}

func (is *Istio) checkPlugin() error {
	p := is.Plugin
	u, err := url.Parse(p.GetUrl())
	switch {
	case p.GetUrl() == "":
		return errors.New("spec.url is required")
	case err != nil:
		return fmt.Errorf("spec.url: %w", err)
	case u.Scheme != "" && u.Scheme != "oci" && u.Scheme != "file" && u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("spec.url %q: scheme must be oci, file, http or https", p.GetUrl())
	case p.GetPluginConfig() == nil:
		return errors.New("spec.pluginConfig is missing (the filter would start with no rules)")
	}
	// Istio marshals pluginConfig to JSON and hands it over as a StringValue.
	if is.RulesJSON, err = protojson.Marshal(p.GetPluginConfig()); err != nil {
		return fmt.Errorf("spec.pluginConfig: %w", err)
	}
	if is.Rules, err = rule.Parse(is.RulesJSON); err != nil {
		return fmt.Errorf("spec.pluginConfig: %w", err)
	}
	c := is.Rules.Sync.Cluster
	if c == "" {
		return nil
	}
	m := istioCluster.FindStringSubmatch(c)
	if m == nil {
		return fmt.Errorf("spec.pluginConfig.sync.cluster %q is not a cluster Istio generates (want outbound|<port>|<subset>|<service FQDN>)", c)
	}
	port, _ := strconv.Atoi(m[1])
	if port < 1 || port > 65535 {
		return fmt.Errorf("spec.pluginConfig.sync.cluster %q: port out of range", c)
	}
	if !strings.Contains(m[3], ".") {
		return fmt.Errorf("spec.pluginConfig.sync.cluster %q: Istio names clusters by the service's FQDN (name.namespace.svc.cluster.local), not a short name", c)
	}
	is.SyncPort, is.SyncHost = port, m[3]
	if subset := m[2]; subset != "" && !is.definesSubset(is.SyncHost, subset) {
		return fmt.Errorf("spec.pluginConfig.sync.cluster %q: no DestinationRule in the manifest defines subset %q for %s", c, subset, is.SyncHost)
	}
	return nil
}

func (is *Istio) definesSubset(host, subset string) bool {
	for _, dr := range is.DestinationRules {
		if dr.GetHost() != host {
			continue
		}
		for _, s := range dr.GetSubsets() {
			if s.GetName() == subset {
				return true
			}
		}
	}
	return false
}

// readResource reads one YAML document; nil, nil for a document with no content.
func readResource(doc []byte) (*Resource, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return nil, nil
	}
	var obj Object
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	newSpec, ok := istioKinds[obj.APIVersion+"/"+obj.Kind]
	if !ok {
		return nil, fmt.Errorf("unsupported apiVersion/kind %s/%s", obj.APIVersion, obj.Kind)
	}
	if !dnsName.MatchString(obj.Metadata.Name) {
		return nil, fmt.Errorf("%s: metadata.name %q is not a DNS-1123 name", obj.Kind, obj.Metadata.Name)
	}
	if ns := obj.Metadata.Namespace; ns != "" && !dnsName.MatchString(ns) {
		return nil, fmt.Errorf("%s %q: metadata.namespace %q is not a DNS-1123 name", obj.Kind, obj.Metadata.Name, ns)
	}
	if len(obj.RawSpec) == 0 {
		return nil, fmt.Errorf("%s %q: spec is required", obj.Kind, obj.Metadata.Name)
	}
	spec := newSpec()
	// Istio reads its resources with the legacy jsonpb, not protojson: a Duration may be
	// any Go duration ("250ms"), where protojson wants "0.250s". Kubernetes' schema for
	// Istio's CRDs has only the camelCase field names, where protojson also takes the
	// proto names (plugin_config). Normalise the first and refuse the second, then let
	// protojson read the spec strictly.
	var raw any
	dec = json.NewDecoder(bytes.NewReader(obj.RawSpec))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%s %q: spec: %w", obj.Kind, obj.Metadata.Name, err)
	}
	norm, err := normalize(spec.ProtoReflect().Descriptor(), raw, "spec")
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", obj.Kind, obj.Metadata.Name, err)
	}
	specJSON, err := json.Marshal(norm)
	if err != nil {
		return nil, fmt.Errorf("%s %q: spec: %w", obj.Kind, obj.Metadata.Name, err)
	}
	if err := strict.Unmarshal(specJSON, spec); err != nil {
		return nil, fmt.Errorf("%s %q: spec: %w", obj.Kind, obj.Metadata.Name, err)
	}
	return &Resource{Object: obj, Spec: spec}, nil
}

// normalize walks a spec's JSON along its message descriptor: an object key must be the
// JSON (camelCase) name of a field, and a Duration written as a Go duration string is
// rewritten in protojson's form. Other well-known types are left as they are (their
// JSON forms are not objects of fields).
func normalize(md protoreflect.MessageDescriptor, v any, path string) (any, error) {
	if md.FullName() == "google.protobuf.Duration" {
		s, ok := v.(string)
		if !ok {
			return v, nil
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("%s: invalid duration %q: %w", path, s, err)
		}
		b, err := protojson.Marshal(durationpb.New(d))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var out string
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return out, nil
	}
	if md.FullName().Parent() == "google.protobuf" {
		return v, nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return v, nil // protojson reports the type mismatch
	}
	fields := md.Fields()
	for k, fv := range obj {
		fd := fields.ByJSONName(k)
		if fd == nil {
			if alt := fields.ByName(protoreflect.Name(k)); alt != nil {
				return nil, fmt.Errorf("%s.%s: write %q (the Kubernetes schema knows only camelCase names)", path, k, alt.JSONName())
			}
			return nil, fmt.Errorf("%s.%s: unknown field", path, k)
		}
		p := path + "." + k
		var err error
		switch {
		case fd.IsMap():
			m, ok := fv.(map[string]any)
			if !ok || fd.MapValue().Message() == nil {
				continue
			}
			for mk, mv := range m {
				if m[mk], err = normalize(fd.MapValue().Message(), mv, p+"["+strconv.Quote(mk)+"]"); err != nil {
					return nil, err
				}
			}
		case fd.Message() == nil:
		case fd.IsList():
			items, _ := fv.([]any)
			for i, item := range items {
				if items[i], err = normalize(fd.Message(), item, p+"["+strconv.Itoa(i)+"]"); err != nil {
					return nil, err
				}
			}
		default:
			if obj[k], err = normalize(fd.Message(), fv, p); err != nil {
				return nil, err
			}
		}
	}
	return obj, nil
}

// splitDocuments splits a YAML stream at "---" lines.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if isDocumentMarker(line) {
			docs = append(docs, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(docs, cur)
}

func isDocumentMarker(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("---"))
	if !ok {
		return false
	}
	rest = bytes.TrimSpace(rest)
	return len(rest) == 0 || rest[0] == '#'
}
