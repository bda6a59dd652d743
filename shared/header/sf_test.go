package header

import (
	"errors"
	"strconv"
	"strings"
)

// A small RFC 9651 List parser, for tests only: it checks that what this package emits
// is valid structured-field syntax and compares fields semantically. It covers the bare
// items the draft uses (sf-string, token, integer, byte sequence) and parameters.

type sfItem struct {
	value  sfBare
	params []sfParam
}

type sfParam struct {
	key   string
	value sfBare
}

type sfBare struct {
	kind byte // 's' string, 't' token, 'i' integer, 'b' byte sequence, '?' boolean
	s    string
	i    int64
}

func (b sfBare) serialize() string {
	switch b.kind {
	case 's':
		var sb strings.Builder
		sb.WriteByte('"')
		for i := 0; i < len(b.s); i++ {
			if b.s[i] == '"' || b.s[i] == '\\' {
				sb.WriteByte('\\')
			}
			sb.WriteByte(b.s[i])
		}
		sb.WriteByte('"')
		return sb.String()
	case 'i':
		return strconv.FormatInt(b.i, 10)
	case 'b':
		return ":" + b.s + ":"
	case '?':
		if b.i != 0 {
			return "?1"
		}
		return "?0"
	}
	return b.s
}

// serializeList is RFC 9651 section 4.1.1: members joined by ", ".
func serializeList(items []sfItem) string {
	var sb strings.Builder
	for i, it := range items {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(it.value.serialize())
		for _, p := range it.params {
			sb.WriteByte(';')
			sb.WriteString(p.key)
			if p.value.kind != '?' || p.value.i == 0 {
				sb.WriteByte('=')
				sb.WriteString(p.value.serialize())
			}
		}
	}
	return sb.String()
}

func (it sfItem) param(key string) (sfBare, bool) {
	for _, p := range it.params {
		if p.key == key {
			return p.value, true
		}
	}
	return sfBare{}, false
}

type sfParser struct {
	s   string
	pos int
}

func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: strings.TrimLeft(s, " ")}
	p.s = strings.TrimRight(p.s, " ")
	var items []sfItem
	for p.pos < len(p.s) {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.ows()
		if p.pos == len(p.s) {
			return items, nil
		}
		if p.s[p.pos] != ',' {
			return nil, errors.New("expected ',' at " + strconv.Itoa(p.pos))
		}
		p.pos++
		p.ows()
		if p.pos == len(p.s) {
			return nil, errors.New("trailing ','")
		}
	}
	return items, nil
}

func (p *sfParser) ows() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{value: v}
	for p.pos < len(p.s) && p.s[p.pos] == ';' {
		p.pos++
		for p.pos < len(p.s) && p.s[p.pos] == ' ' {
			p.pos++
		}
		key, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		val := sfBare{kind: '?', i: 1}
		if p.pos < len(p.s) && p.s[p.pos] == '=' {
			p.pos++
			if val, err = p.bare(); err != nil {
				return sfItem{}, err
			}
		}
		it.params = append(it.params, sfParam{key, val})
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.pos
	if p.pos >= len(p.s) || !(p.s[p.pos] >= 'a' && p.s[p.pos] <= 'z' || p.s[p.pos] == '*') {
		return "", errors.New("bad key at " + strconv.Itoa(p.pos))
	}
	for p.pos < len(p.s) && strings.IndexByte("abcdefghijklmnopqrstuvwxyz0123456789_-.*", p.s[p.pos]) >= 0 {
		p.pos++
	}
	return p.s[start:p.pos], nil
}

func (p *sfParser) bare() (sfBare, error) {
	if p.pos >= len(p.s) {
		return sfBare{}, errors.New("missing item")
	}
	switch c := p.s[p.pos]; {
	case c == '"':
		return p.str()
	case c == '-' || c >= '0' && c <= '9':
		start := p.pos
		p.pos++
		for p.pos < len(p.s) && p.s[p.pos] >= '0' && p.s[p.pos] <= '9' {
			p.pos++
		}
		if p.pos-start > 16 || p.s[start:p.pos] == "-" {
			return sfBare{}, errors.New("bad integer")
		}
		i, err := strconv.ParseInt(p.s[start:p.pos], 10, 64)
		return sfBare{kind: 'i', i: i}, err
	case c == ':':
		end := strings.IndexByte(p.s[p.pos+1:], ':')
		if end < 0 {
			return sfBare{}, errors.New("unterminated byte sequence")
		}
		v := p.s[p.pos+1 : p.pos+1+end]
		p.pos += end + 2
		return sfBare{kind: 'b', s: v}, nil
	case c == '?':
		if p.pos+1 < len(p.s) && (p.s[p.pos+1] == '0' || p.s[p.pos+1] == '1') {
			p.pos += 2
			return sfBare{kind: '?', i: int64(p.s[p.pos-1] - '0')}, nil
		}
		return sfBare{}, errors.New("bad boolean")
	case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '*':
		start := p.pos
		for p.pos < len(p.s) && (isTchar(p.s[p.pos]) || p.s[p.pos] == ':' || p.s[p.pos] == '/') {
			p.pos++
		}
		return sfBare{kind: 't', s: p.s[start:p.pos]}, nil
	}
	return sfBare{}, errors.New("bad item at " + strconv.Itoa(p.pos))
}

func (p *sfParser) str() (sfBare, error) {
	var sb strings.Builder
	p.pos++ // opening quote
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		p.pos++
		switch {
		case c == '\\':
			if p.pos >= len(p.s) || (p.s[p.pos] != '"' && p.s[p.pos] != '\\') {
				return sfBare{}, errors.New("bad escape")
			}
			sb.WriteByte(p.s[p.pos])
			p.pos++
		case c == '"':
			return sfBare{kind: 's', s: sb.String()}, nil
		case c < 0x20 || c > 0x7e:
			return sfBare{}, errors.New("invalid character in string")
		default:
			sb.WriteByte(c)
		}
	}
	return sfBare{}, errors.New("unterminated string")
}

func isTchar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
