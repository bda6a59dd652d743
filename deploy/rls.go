package deploy

import (
	"errors"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// EnvoyRLS is what CheckEnvoyRLS found in a bootstrap.
type EnvoyRLS struct {
	Bootstrap *bootstrapv3.Bootstrap
	Filter    *ratelimitv3.RateLimit // the native rate limit filter's typed_config
	Cluster   *clusterv3.Cluster     // the cluster of its rate limit service
	// RateLimits are the rate_limits of every virtual host and route, in order.
	RateLimits []*routev3.RateLimit
}

// CheckEnvoyRLS reads an Envoy v3 bootstrap that uses Envoy's native rate limit filter
// with Tollgate's rate limit service (envoy-rls.yaml) strictly, validates it and every
// typed_config in it, and checks what Envoy would only discover when traffic flows:
// exactly one envoy.filters.http.ratelimit filter, before the router, with a domain,
// the v3 transport, and an envoy_grpc service whose cluster the bootstrap defines and
// speaks HTTP/2 (gRPC does not work over HTTP/1.1); at least one rate_limits action list
// (without one the filter never calls the service); every route to a defined cluster.
func CheckEnvoyRLS(data []byte) (*EnvoyRLS, error) {
	b, err := readBootstrap(data)
	if err != nil {
		return nil, err
	}
	clusters := make(map[string]*clusterv3.Cluster)
	names := make(map[string]bool)
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()], names[c.GetName()] = c, true
	}
	e := &EnvoyRLS{Bootstrap: b}
	var found []*ratelimitv3.RateLimit
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, nf := range fc.GetFilters() {
				if !nf.GetTypedConfig().MessageIs(&hcmv3.HttpConnectionManager{}) {
					continue
				}
				hcm := &hcmv3.HttpConnectionManager{}
				if err := nf.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					return nil, fmt.Errorf("envoy bootstrap: listener %q: %w", l.GetName(), err)
				}
				if err := checkRoutes(l.GetName(), hcm.GetRouteConfig(), names); err != nil {
					return nil, err
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					e.RateLimits = append(e.RateLimits, vh.GetRateLimits()...)
					for _, r := range vh.GetRoutes() {
						e.RateLimits = append(e.RateLimits, r.GetRoute().GetRateLimits()...)
					}
				}
				filters := hcm.GetHttpFilters()
				for i, hf := range filters {
					if !hf.GetTypedConfig().MessageIs(&ratelimitv3.RateLimit{}) {
						continue
					}
					rl := &ratelimitv3.RateLimit{}
					if err := hf.GetTypedConfig().UnmarshalTo(rl); err != nil {
						return nil, fmt.Errorf("envoy bootstrap: listener %q: http filter %q: %w", l.GetName(), hf.GetName(), err)
					}
					if i == len(filters)-1 || !filters[len(filters)-1].GetTypedConfig().MessageIs(&routerv3.Router{}) {
						return nil, fmt.Errorf("envoy bootstrap: listener %q: the rate limit filter must come before envoy.filters.http.router, the last HTTP filter", l.GetName())
					}
					found = append(found, rl)
				}
			}
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("envoy bootstrap: want exactly one envoy.filters.http.ratelimit filter, found %d", len(found))
	}
	e.Filter = found[0]
	svc := e.Filter.GetRateLimitService()
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	switch {
	case e.Filter.GetDomain() == "":
		return nil, errors.New("envoy bootstrap: the rate limit filter's domain is empty: the rule set's descriptor matches name one")
	case svc.GetTransportApiVersion() != corev3.ApiVersion_V3:
		return nil, errors.New("envoy bootstrap: rate_limit_service.transport_api_version must be V3 (the service answers envoy.service.ratelimit.v3 only)")
	case name == "":
		return nil, errors.New("envoy bootstrap: rate_limit_service.grpc_service names no envoy_grpc cluster")
	case clusters[name] == nil:
		return nil, fmt.Errorf("envoy bootstrap: rate_limit_service cluster %q is not a cluster of static_resources", name)
	case len(e.RateLimits) == 0:
		return nil, errors.New("envoy bootstrap: no virtual host or route has rate_limits: the filter would never call the service")
	}
	e.Cluster = clusters[name]
	if !http2(e.Cluster) {
		return nil, fmt.Errorf("envoy bootstrap: cluster %q must speak HTTP/2 for gRPC (typed_extension_protocol_options HttpProtocolOptions explicit_http_config.http2_protocol_options)", name)
	}
	return e, nil
}

// http2 reports whether a cluster's upstream protocol is HTTP/2.
func http2(c *clusterv3.Cluster) bool {
	a := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if a == nil {
		return false
	}
	o := &upstreamhttpv3.HttpProtocolOptions{}
	if err := a.UnmarshalTo(o); err != nil {
		return false
	}
	return o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}
