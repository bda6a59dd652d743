package wazerohost

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"
	"unsafe"
)

// property answers proxy_get_property for the subset of Envoy's attributes a filter
// like Tollgate uses. Paths arrive as NUL-separated segments ("source\x00address").
// Strings are returned raw and integers as 8 little-endian bytes, as Envoy serialises
// CEL values. Config.Properties (dotted paths) are consulted first, then the built-in
// attributes, then values the stream set with proxy_set_property.
func (v *vm) property(c *pctx, path string) ([]byte, Status) {
	parts := strings.Split(path, "\x00")
	dotted := strings.Join(parts, ".")
	if val, ok := v.host.cfg.Properties[dotted]; ok {
		return []byte(val), StatusOK
	}
	cfg := &v.host.cfg
	switch dotted {
	case "plugin_root_id":
		return []byte(cfg.RootID), StatusOK
	case "plugin_name":
		return []byte(cfg.PluginName), StatusOK
	case "plugin_vm_id":
		return []byte(cfg.VMID), StatusOK
	case "node.id":
		return []byte(cfg.NodeID), StatusOK
	}
	if !c.isRoot() && c.req != nil {
		if val, st, ok := metadataProperty(c.req, parts); ok {
			return val, st
		}
		if val, ok := requestProperty(c, parts); ok {
			return val, StatusOK
		}
	}
	if !c.isRoot() {
		if val, ok := c.prop(path); ok {
			return val, StatusOK
		}
	}
	return nil, StatusNotFound
}

func requestProperty(c *pctx, parts []string) ([]byte, bool) {
	r := c.req
	if len(parts) < 2 {
		return nil, false
	}
	switch parts[0] {
	case "source":
		return addrProperty(r.RemoteAddr, parts[1])
	case "destination":
		return addrProperty(r.LocalAddr, parts[1])
	case "request":
		switch parts[1] {
		case "path":
			return []byte(r.Path), true
		case "url_path":
			p, _, _ := strings.Cut(r.Path, "?")
			return []byte(p), true
		case "host":
			return []byte(r.Authority), true
		case "scheme":
			return []byte(r.scheme()), true
		case "method":
			return []byte(r.Method), true
		case "protocol":
			return []byte(r.protocol()), true
		case "id":
			if v, ok := c.reqMap.get("x-request-id"); ok {
				return []byte(v), true
			}
		case "headers":
			if len(parts) == 3 {
				if v, ok := c.reqMap.get(parts[2]); ok {
					return []byte(v), true
				}
			}
		}
	case "response":
		if parts[1] == "code" && c.respMap != nil {
			if s, ok := c.respMap.get(":status"); ok {
				if n, err := strconv.ParseInt(s, 10, 64); err == nil {
					return int64Bytes(n), true
				}
			}
		}
	}
	return nil, false
}

// addrProperty serves "address" (ip:port, as Envoy prints it) and "port" (int64).
func addrProperty(addr, field string) ([]byte, bool) {
	if addr == "" {
		return nil, false
	}
	switch field {
	case "address":
		return []byte(addr), true
	case "port":
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, false
		}
		n, err := strconv.ParseInt(port, 10, 64)
		if err != nil {
			return nil, false
		}
		return int64Bytes(n), true
	}
	return nil, false
}

func int64Bytes(n int64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(n))
	return b
}

// prop is one property a stream set with proxy_set_property: path and value share one
// allocation, and a stream's first property lives in pctx itself, so the common case —
// one property per request — costs the host one allocation.
type prop struct {
	path  string
	value []byte
}

// setProp sets (or replaces) a stream property, copying path and value.
func (c *pctx) setProp(path, value []byte) {
	buf := make([]byte, len(path)+len(value))
	copy(buf, path)
	copy(buf[len(path):], value)
	// The path aliases buf, which nothing writes again.
	p := prop{path: unsafe.String(unsafe.SliceData(buf), len(path)), value: buf[len(path):]}
	for i := range c.props {
		if c.props[i].path == p.path {
			c.props[i] = p
			return
		}
	}
	if c.props == nil {
		c.props = c.prop1[:0]
	}
	c.props = append(c.props, p)
}

// prop returns a stream property by its raw (NUL-separated) path.
func (c *pctx) prop(path string) ([]byte, bool) {
	for i := range c.props {
		if c.props[i].path == path {
			return c.props[i].value, true
		}
	}
	return nil, false
}
