package rule

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

// Apply appends to dst every rule that matches req, in config order, with its caller
// key, windows (override > tier > the rule's own), tier and cost resolved, and returns
// the extended slice. A rule whose key cannot be extracted is left out, unless its
// MissingKey policy says otherwise: a fallback source's key is used, or the rule is
// appended with Refuse set (and no key or windows) for the caller to refuse the request.
//
// Apply runs on every request in the filter, so it allocates nothing for the common
// cases: pass a reused dst[:0]; the path is normalised in place unless it needs
// rewriting; regexps run only for rules that configure them; the default key and the
// tier are computed at most once per call. (JWT keys cost one allocation; composite and
// lower-cased keys one each unless the request has a KeyBuf.)
func (c *Config) Apply(req *Request, dst []Applied) []Applied {
	if c == nil || req == nil {
		return dst
	}
	path := NormalizePath(req.Path)
	host := hostOnly(req.Host)
	var (
		defKey            string
		defDone           bool
		tierName, tierFor string // tierName is the tier of key tierFor
		tierDone          bool
	)
	for i := range c.Rules {
		r := &c.Rules[i]
		if r.DescriptorOnly || !r.Match.matches(req, host, path) {
			continue
		}
		var key string
		if r.Key.IsZero() {
			if !defDone {
				defKey, defDone = c.defaultKey().Extract(req), true
			}
			key = defKey
		} else {
			key = r.Key.Extract(req)
		}
		if key == "" {
			switch r.MissingKey.Action {
			case MissingDeny:
				dst = append(dst, Applied{Rule: r, Index: i, Refuse: r.MissingKey.Status, Cost: 1})
				continue
			case MissingFallback:
				key = r.MissingKey.Key.Extract(req)
			}
			if key == "" {
				continue
			}
		}
		a := Applied{Rule: r, Key: key, Windows: r.Windows, Cost: r.costFor(path), Index: i}
		if o := r.overrideFor(key); o >= 0 {
			a.Windows, a.Override = r.Overrides[o].Windows, o+1
		} else if len(r.Tiers) > 0 {
			if !tierDone || tierFor != key {
				tierName, tierFor, tierDone = c.Tier(req, key), key, true
			}
			if w, ok := r.Tiers[tierName]; ok && tierName != "" {
				a.Windows, a.Tier = w, tierName
			}
		}
		dst = append(dst, a)
	}
	return dst
}

var builtinKey = builtinDefaultKey()

func (c *Config) defaultKey() *KeySource {
	if c.DefaultKey.IsZero() {
		return &builtinKey
	}
	return &c.DefaultKey
}

// IsZero reports whether k is the zero KeySource, which a Rule uses to mean "the
// config's default key source" (a parsed header source always has a name).
func (k *KeySource) IsZero() bool {
	return k.Kind == KeyHeader && k.Header == "" && k.Claim == "" && k.TrustedHops == 0 && k.Parts == nil && k.Fallback == nil &&
		k.Query == "" && k.Property == nil && k.StripPrefix == "" && !k.Lower
}

// hasPathPrefix matches whole segments: "/search" covers "/search" and "/search/x" but
// not "/searching", so a rule for one endpoint does not silently cover its neighbours.
func hasPathPrefix(path, prefix string) bool {
	if prefix == "/" || prefix == "" {
		return true
	}
	return strings.HasPrefix(path, prefix) && (len(path) == len(prefix) || path[len(prefix)] == '/')
}

func (r *Rule) costFor(path string) int64 {
	for i := range r.Costs {
		rc := &r.Costs[i]
		if rc.Prefix != "" && hasPathPrefix(path, rc.Prefix) || rc.Regex != nil && rc.Regex.MatchString(path) {
			return rc.Cost
		}
	}
	if r.Cost < 1 {
		return 1
	}
	return r.Cost
}

// overrideFor returns the index of the first override whose glob matches key, or -1.
func (r *Rule) overrideFor(key string) int {
	if len(r.Overrides) == 0 {
		return -1
	}
	if r.overrideIdx != nil {
		return r.overrideIdx.first(key)
	}
	for i := range r.Overrides {
		if globMatch(r.Overrides[i].Glob, key, false) {
			return i
		}
	}
	return -1
}

// Tier returns the name of the first tier definition that matches the caller key (by
// glob) or the request (by header value), or "" when none does.
func (c *Config) Tier(req *Request, key string) string {
	for i := range c.Tiers {
		t := &c.Tiers[i]
		if key != "" && len(t.Keys) > 0 {
			if c.tierIdx != nil {
				if c.tierIdx[i].first(key) >= 0 {
					return t.Name
				}
			} else {
				for _, g := range t.Keys {
					if globMatch(g, key, false) {
						return t.Name
					}
				}
			}
		}
		if t.Header != "" {
			if v := headerValue(req, t.Header); v != "" {
				for _, x := range t.Values {
					if x == v {
						return t.Name
					}
				}
			}
		}
	}
	return ""
}

// RuleByID returns the rule with the given id, or nil.
func (c *Config) RuleByID(id string) *Rule {
	if c == nil {
		return nil
	}
	if c.byID != nil {
		if i, ok := c.byID[id]; ok {
			return &c.Rules[i]
		}
		return nil
	}
	for i := range c.Rules {
		if c.Rules[i].ID == id {
			return &c.Rules[i]
		}
	}
	return nil
}

// ListAction is the outcome of the allow/deny lists.
type ListAction uint8

const (
	ListNone  ListAction = iota // on neither list: rate-limit as usual
	ListAllow                   // bypass rate limiting
	ListDeny                    // refuse with 403
)

func (a ListAction) String() string {
	switch a {
	case ListAllow:
		return "allow"
	case ListDeny:
		return "deny"
	}
	return "none"
}

// ListVerdict says which list matched and by which entry (its Raw text, for logs and
// metrics; "" with ListNone).
type ListVerdict struct {
	Action  ListAction
	Pattern string
	// ByAddress is set when the entry is an IP or CIDR (the 403 body then says the
	// address, not the key, is refused).
	ByAddress bool
}

// CheckLists matches the caller key against the key globs and clientIP (an address,
// with or without a port; see ClientIP) against the IPs and CIDRs of the deny and allow
// lists. Deny beats allow; within a list the first matching entry in config order is
// reported. An empty key matches no glob (not even "*").
func (c *Config) CheckLists(key, clientIP string) ListVerdict {
	if c == nil || len(c.Deny) == 0 && len(c.Allow) == 0 {
		return ListVerdict{}
	}
	var ip [16]byte
	ipOK := false
	if clientIP != "" {
		if a, err := netip.ParseAddr(hostOnly(clientIP)); err == nil {
			ip, ipOK = a.As16(), true
		}
	}
	if i := firstPattern(c.Deny, c.denyIdx, key, &ip, ipOK); i >= 0 {
		return ListVerdict{Action: ListDeny, Pattern: c.Deny[i].Raw, ByAddress: c.Deny[i].CIDR != nil}
	}
	if i := firstPattern(c.Allow, c.allowIdx, key, &ip, ipOK); i >= 0 {
		return ListVerdict{Action: ListAllow, Pattern: c.Allow[i].Raw, ByAddress: c.Allow[i].CIDR != nil}
	}
	return ListVerdict{}
}

// firstPattern returns the lowest index of list matching key or ip, or -1.
func firstPattern(list []Pattern, idx *listIndex, key string, ip *[16]byte, ipOK bool) int {
	if idx == nil {
		for i := range list {
			p := &list[i]
			if p.CIDR != nil && ipOK && p.CIDR.contains(ip) || p.Glob != "" && key != "" && globMatch(p.Glob, key, false) {
				return i
			}
		}
		return -1
	}
	best := -1
	if key != "" {
		best = idx.globs.first(key)
	}
	if ipOK {
		for _, i := range idx.cidrs {
			if best >= 0 && i > best {
				break
			}
			if list[i].CIDR.contains(ip) {
				return i
			}
		}
	}
	return best
}

func (n *IPNet) contains(ip *[16]byte) bool {
	bits := n.Bits
	if bits < 0 || bits > 128 {
		return false
	}
	full := bits / 8
	for i := 0; i < full; i++ {
		if n.Addr[i] != ip[i] {
			return false
		}
	}
	if rem := bits % 8; rem != 0 {
		mask := byte(0xff) << (8 - rem)
		return n.Addr[full]&mask == ip[full]&mask
	}
	return true
}

// parseIPNet parses a bare IP address as a single-address network. It returns nil, nil
// when s is not an IP at all (the caller treats it as a glob).
func parseIPNet(s string) (*IPNet, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return nil, nil
	}
	if a.Zone() != "" {
		return nil, errors.New("zones are not allowed")
	}
	return &IPNet{Addr: a.As16(), Bits: 128}, nil
}

// parseCIDR parses "addr/bits". Host bits must be zero: "10.0.0.1/8" is far more often
// a typo for a /32 than a deliberate /8.
func parseCIDR(s string) (*IPNet, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return nil, err
	}
	if m := p.Masked(); m != p {
		return nil, errors.New("host bits set (did you mean " + strconv.Quote(m.String()) + "?)")
	}
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return &IPNet{Addr: p.Addr().As16(), Bits: bits}, nil
}

// globMatch reports whether s matches pattern, where "*" matches any run of bytes and
// "?" exactly one byte; fold makes ASCII letters case-insensitive (hosts). It is written
// here rather than taken from path.Match because path.Match stops "*" at "/" and
// reports syntax errors for "[" and "\\": keys are opaque strings that may hold "/"
// (base64) and brackets, and "sk_internal_*" must cover all of them. It allocates
// nothing and backtracks only to the last "*", so it is O(len(pattern)*len(s)) at
// worst.
func globMatch(pattern, s string, fold bool) bool {
	px, sx := 0, 0
	starPx, starSx := -1, 0
	for px < len(pattern) || sx < len(s) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starPx, starSx = px, sx
				px++
				continue
			case '?':
				if sx < len(s) {
					px++
					sx++
					continue
				}
			default:
				if sx < len(s) && (c == s[sx] || fold && lower(c) == lower(s[sx])) {
					px++
					sx++
					continue
				}
			}
		}
		// Mismatch: let the last "*" swallow one more byte, if there is one.
		if starPx >= 0 && starSx < len(s) {
			starSx++
			px, sx = starPx+1, starSx
			continue
		}
		return false
	}
	return true
}

func lower(b byte) byte {
	if b >= 'A' && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

func hasWildcard(s string) bool { return strings.ContainsAny(s, "*?") }

// globSet finds the first (lowest-index) glob of a list matching a string without
// scanning literal entries: lists of thousands of exact API keys cost one map lookup
// plus a scan of the entries that really are patterns.
type globSet struct {
	pats  []string
	exact map[string]int // literal pattern -> lowest index
	wild  []int          // indexes of patterns with wildcards, ascending
}

// newGlobSet indexes pats; "" entries (CIDRs in a Pattern list) are skipped.
func newGlobSet(pats []string) *globSet {
	g := &globSet{pats: pats}
	for i, p := range pats {
		switch {
		case p == "":
		case hasWildcard(p):
			g.wild = append(g.wild, i)
		default:
			if g.exact == nil {
				g.exact = make(map[string]int)
			}
			if _, dup := g.exact[p]; !dup {
				g.exact[p] = i
			}
		}
	}
	return g
}

func (g *globSet) first(s string) int {
	best := -1
	if i, ok := g.exact[s]; ok {
		best = i
	}
	for _, i := range g.wild {
		if best >= 0 && i > best {
			break
		}
		if globMatch(g.pats[i], s, false) {
			return i
		}
	}
	return best
}

type listIndex struct {
	globs *globSet
	cidrs []int // indexes of IP/CIDR entries, ascending
}

func newListIndex(list []Pattern) *listIndex {
	pats := make([]string, len(list))
	idx := &listIndex{}
	for i := range list {
		if list[i].CIDR != nil {
			idx.cidrs = append(idx.cidrs, i)
		} else {
			pats[i] = list[i].Glob
		}
	}
	idx.globs = newGlobSet(pats)
	return idx
}

func (c *Config) buildIndexes() {
	c.allowIdx = newListIndex(c.Allow)
	c.denyIdx = newListIndex(c.Deny)
	c.tierIdx = make([]*globSet, len(c.Tiers))
	for i := range c.Tiers {
		c.tierIdx[i] = newGlobSet(c.Tiers[i].Keys)
	}
	c.byID = make(map[string]int, len(c.Rules))
	for i := range c.Rules {
		r := &c.Rules[i]
		c.byID[r.ID] = i
		if len(r.Overrides) > 0 {
			pats := make([]string, len(r.Overrides))
			for j := range r.Overrides {
				pats[j] = r.Overrides[j].Glob
			}
			r.overrideIdx = newGlobSet(pats)
		}
	}
}

// CallerKey is the request's key under the config's default key source: the identity the
// allow and deny lists' globs are matched against.
func (c *Config) CallerKey(req *Request) string { return c.defaultKey().Extract(req) }
