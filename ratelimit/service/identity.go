package service

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/tollgate-rl/tollgate/ratelimit/credential"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// A gateway's sync credential names its node, so that holding one gateway's credential
// gives no power over another's: its batch sequence and idempotency records are kept
// under its node id (ratelimit/README.md, "Gateway identity"). Outside a mesh the
// credential is a node token (package credential); under Istio the mTLS peer's SPIFFE
// id, which the service's own sidecar passes in x-forwarded-client-cert, scopes the node
// instead.

// Credential kinds (the mode label of tollgate_sync_auth_total).
const (
	authNodeToken = "node_token"
	authMesh      = "mesh"
	authShared    = "shared_secret"
	authInsecure  = "insecure"
)

// identity is who sent a request to the sync API.
type identity struct {
	mode string
	// node is the only node a node token may sync as.
	node string
	// scope prefixes the node ids of a mesh peer: its SPIFFE id.
	scope string
}

// bind makes b's node the one the credential allows, or says why it cannot. A node
// token syncs only as its node; a mesh peer's node ids are scoped by its SPIFFE id, so
// two service accounts never share a node. claimed is the node id as the gateway sent
// it (a previous-protocol batch's node is "<node>#<worker>" after decoding).
func (id identity) bind(b *wire.Batch, claimed string) string {
	switch id.mode {
	case authNodeToken:
		if claimed != id.node {
			return fmt.Sprintf("node: the credential is node %q's, the batch names %q", id.node, claimed)
		}
	case authMesh:
		b.Node = id.scope + "/" + b.Node
	}
	return ""
}

// MeshIdentity configures how a mesh peer is recognised.
type MeshIdentity struct {
	// Enabled: a request relayed by a trusted proxy with an x-forwarded-client-cert
	// header is authenticated by the URI (SPIFFE id) of the certificate in its last
	// element, the one the nearest proxy (the service's sidecar) added.
	Enabled bool
	// TrustedProxies are the addresses the sidecar connects from (Istio: 127.0.0.6, so
	// 127.0.0.0/8 and ::1). An x-forwarded-client-cert from anyone else is ignored.
	TrustedProxies []netip.Prefix
}

// XFCCHeader is Envoy's x-forwarded-client-cert.
const XFCCHeader = "X-Forwarded-Client-Cert"

// authenticate names the caller of a sync-API request, or reports it unauthenticated.
// In order: a mesh peer (a trusted proxy's XFCC), a node token, the master secret itself
// (unless node tokens only), anyone when no secret is set and the service runs insecure.
func (s *Service) authenticate(r *http.Request) (identity, bool) {
	if s.cfg.Mesh.Enabled {
		if spiffe, ok := s.meshPeer(r.RemoteAddr, r.Header.Values(XFCCHeader)); ok {
			return identity{mode: authMesh, scope: spiffe}, true
		}
	}
	return s.authenticateBearer(r.Header.Get("Authorization"))
}

// authenticateBearer checks an Authorization value ("Bearer <credential>").
func (s *Service) authenticateBearer(authorization string) (identity, bool) {
	masters := *s.syncSecrets.Load()
	if len(masters) == 0 {
		return identity{mode: authInsecure}, s.cfg.Insecure
	}
	got, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok || got == "" {
		return identity{}, false
	}
	if node, ok := credential.Verify(got, masters); ok {
		return identity{mode: authNodeToken, node: node}, true
	}
	if !s.cfg.NodeTokensOnly && bearerValue(authorization, &masters) {
		return identity{mode: authShared}, true
	}
	return identity{}, false
}

// meshPeer returns the SPIFFE id of the mTLS peer a trusted proxy relays.
func (s *Service) meshPeer(remote string, xfcc []string) (string, bool) {
	if len(xfcc) == 0 {
		return "", false
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return "", false
	}
	addr = addr.Unmap()
	trusted := false
	for _, p := range s.cfg.Mesh.TrustedProxies {
		trusted = trusted || p.Contains(addr)
	}
	if !trusted {
		return "", false
	}
	return lastXFCCURI(strings.Join(xfcc, ","))
}

// lastXFCCURI returns the spiffe:// URI of the last element of an XFCC header value
// (elements separated by commas, pairs by semicolons, values possibly quoted with
// backslash escapes). Envoy appends its element last (APPEND_FORWARD) or replaces the
// header (SANITIZE_SET): either way the last element is the nearest proxy's.
func lastXFCCURI(v string) (string, bool) {
	elems := splitQuoted(v, ',')
	if len(elems) == 0 {
		return "", false
	}
	uri := ""
	for _, pair := range splitQuoted(elems[len(elems)-1], ';') {
		k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(k, "URI") {
			continue
		}
		val = unquote(val)
		if strings.HasPrefix(val, "spiffe://") && uri == "" {
			uri = val
		}
	}
	if uri == "" || credential.ValidNode(uri) != "" {
		return "", false
	}
	return uri, true
}

// splitQuoted splits s at sep outside double quotes.
func splitQuoted(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func unquote(v string) string {
	v = strings.TrimSpace(v)
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return v
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		if v[i] == '\\' && i+1 < len(v)-1 {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}
