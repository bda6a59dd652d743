// Package respcost finds the cost a response reports (rule.CostFrom): a header value, or
// a number in a JSON body or in the last server-sent event carrying it. It reads a body
// as it streams through the filter, chunk by chunk, and never holds more of it than the
// rule's max_body_bytes, whatever the body's size.
package respcost

import (
	"bytes"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// MaxCost caps a reported cost (algo.MaxCost: the largest a request may charge).
const MaxCost = 1_000_000

// ParseCost reads a reported cost: decimal digits, optionally surrounded by spaces; a
// value above MaxCost counts as MaxCost. ok is false for anything else.
func ParseCost(s []byte) (cost int64, ok bool) {
	s = bytes.TrimSpace(s)
	if len(s) == 0 {
		return 0, false
	}
	for _, b := range s {
		if b < '0' || b > '9' {
			return 0, false
		}
		if cost = cost*10 + int64(b-'0'); cost > MaxCost {
			cost = MaxCost + 1 // keep reading to refuse trailing garbage, without overflow
		}
	}
	return min(cost, MaxCost), true
}

// Scanner follows one response body. Reset it for each response; its buffer is kept
// across responses, so a scanner reused by the streams of a worker stops allocating once
// it has grown to the rule's cap.
type Scanner struct {
	path  string
	first string // path's first key (the tail lookup)
	rest  string // path after the first key ("" when it has one)
	max   int
	sse   bool

	buf   []byte // JSON: the body, or its last max..2·max bytes; SSE: the current line
	total int64  // JSON: body bytes seen

	// SSE: the current event's data (its data lines joined by "\n"), whether the current
	// line or event outgrew max (skipped), and the last event's verdict.
	data     []byte
	cr       bool // the last chunk ended with CR
	skipLine bool
	skipData bool
	found    bool
	cost     int64
}

// Reset prepares s for a response: path is the rule's body path, max its
// max_body_bytes, sse whether the response is a text/event-stream.
func (s *Scanner) Reset(path string, max int, sse bool) {
	s.path, s.max, s.sse = path, max, sse
	s.first, s.rest, _ = strings.Cut(path, ".")
	s.buf, s.data = s.buf[:0], s.data[:0]
	s.total, s.cr, s.skipLine, s.skipData, s.found, s.cost = 0, false, false, false, false, 0
}

// Write takes the next chunk of the body.
func (s *Scanner) Write(chunk []byte) {
	if s.sse {
		s.writeSSE(chunk)
		return
	}
	s.total += int64(len(chunk))
	if len(chunk) >= s.max {
		s.buf = append(s.buf[:0], chunk[len(chunk)-s.max:]...)
		return
	}
	if len(s.buf)+len(chunk) > 2*s.max {
		// Keep the last max bytes: the body is too large to parse whole, and only its
		// tail is looked at.
		keep := s.max - len(chunk)
		s.buf = append(s.buf[:0], s.buf[len(s.buf)-keep:]...)
	}
	s.buf = append(s.buf, chunk...)
}

// Result is the cost the body reported, once it has ended: ok is false when the path is
// missing, its value is not a non-negative integer, or the body was too large to find it.
func (s *Scanner) Result() (cost int64, ok bool) {
	if s.sse {
		s.endLine() // a last line without its newline
		s.endEvent()
		return s.cost, s.found
	}
	if s.total <= int64(s.max) {
		return number(gjson.Get(alias(s.buf), s.path))
	}
	return s.tail()
}

// tail looks the path up in the last max bytes of a body too large to parse whole: at
// the last occurrence of its first key as a key ("first" then ':'; inside a JSON string
// a quote is escaped, so the unescaped form is a key), the value that follows is parsed.
// APIs put their usage object at the end, which is what this finds.
func (s *Scanner) tail() (int64, bool) {
	b := s.buf
	if len(b) > s.max {
		b = b[len(b)-s.max:]
	}
	for end := len(b); end > 0; {
		i := lastKey(b[:end], s.first)
		if i < 0 {
			return 0, false
		}
		j := i + len(s.first) + 2
		for j < len(b) && isSpace(b[j]) {
			j++
		}
		if j < len(b) && b[j] == ':' {
			v := gjson.Parse(alias(b[j+1:]))
			if s.rest != "" {
				v = v.Get(s.rest)
			}
			return number(v)
		}
		end = i
	}
	return 0, false
}

// lastKey returns the index of the last `"key"` in b, or -1.
func lastKey(b []byte, key string) int {
	for end := len(b); ; {
		i := bytes.LastIndex(b[:end], []byte(key))
		if i < 1 {
			return -1
		}
		if b[i-1] == '"' && i+len(key) < len(b) && b[i+len(key)] == '"' && (i < 2 || b[i-2] != '\\') {
			return i - 1
		}
		end = i
	}
}

// alias views b as a string without copying: gjson's results then alias b too (its
// GetBytes copies them, an allocation per lookup), and only their number is read, before
// b changes.
func alias(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// number reads a cost from a JSON value: a non-negative integer (an integral float such
// as 12.0 too).
func number(v gjson.Result) (int64, bool) {
	if v.Type != gjson.Number || v.Num < 0 || v.Num != float64(int64(v.Num)) {
		return 0, false
	}
	return min(int64(v.Num), MaxCost), true
}

// mentionsKey reports whether data holds the path's first key as a JSON key whose value
// is not null: a cheap test before parsing (an event stream repeats "usage":null in
// every content event and reports it once, at the end).
func (s *Scanner) mentionsKey(data []byte) bool {
	key := unsafe.Slice(unsafe.StringData(s.first), len(s.first))
	for rest := data; ; {
		i := bytes.Index(rest, key)
		if i < 0 {
			return false
		}
		end := i + len(key)
		if i > 0 && rest[i-1] == '"' && end < len(rest) && rest[end] == '"' {
			j := end + 1
			for j < len(rest) && isSpace(rest[j]) {
				j++
			}
			if j < len(rest) && rest[j] == ':' {
				for j++; j < len(rest) && isSpace(rest[j]); j++ {
				}
				if !bytes.HasPrefix(rest[j:], []byte("null")) {
					return true
				}
			}
		}
		rest = rest[i+1:]
	}
}

// writeSSE splits the stream into lines (LF, CRLF or CR: the event-stream format) and
// events (a blank line ends one).
func (s *Scanner) writeSSE(chunk []byte) {
	if s.cr && len(chunk) > 0 && chunk[0] == '\n' {
		chunk = chunk[1:] // the LF of a CRLF split between chunks
	}
	s.cr = false
	for len(chunk) > 0 {
		// Lines end in LF almost always: find it with the fast byte search, then look
		// for a CR only before it.
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 {
			i = len(chunk)
		}
		if j := bytes.IndexByte(chunk[:i], '\r'); j >= 0 {
			i = j
		}
		if i == len(chunk) {
			s.appendLine(chunk)
			return
		}
		s.appendLine(chunk[:i])
		if chunk[i] == '\r' {
			if i+1 == len(chunk) {
				s.cr = true
			} else if chunk[i+1] == '\n' {
				i++ // CRLF: one line end
			}
		}
		s.endLine()
		chunk = chunk[i+1:]
	}
}

func (s *Scanner) appendLine(b []byte) {
	if s.skipLine {
		return
	}
	if len(s.buf)+len(b) > s.max {
		s.skipLine, s.buf = true, s.buf[:0]
		return
	}
	s.buf = append(s.buf, b...)
}

// endLine handles one complete line: a data field is added to the event, a blank line
// ends the event; other fields (event, id, retry) and comments are ignored.
func (s *Scanner) endLine() {
	line, skipped := s.buf, s.skipLine
	s.buf, s.skipLine = s.buf[:0], false
	switch {
	case skipped:
		s.skipData = true // a line too long to keep: its event is not evaluated
	case len(line) == 0:
		s.endEvent()
	case bytes.HasPrefix(line, []byte("data:")):
		v := line[len("data:"):]
		if len(v) > 0 && v[0] == ' ' {
			v = v[1:]
		}
		if len(s.data) > 0 {
			s.data = append(s.data, '\n')
		}
		if len(s.data)+len(v) > s.max {
			s.skipData = true
			return
		}
		s.data = append(s.data, v...)
	}
}

// endEvent evaluates the event's data: the last event with the path wins.
func (s *Scanner) endEvent() {
	data, skipped := s.data, s.skipData
	s.data, s.skipData = s.data[:0], false
	if skipped || len(data) == 0 {
		return
	}
	if !s.mentionsKey(data) {
		return // most events of a stream: content deltas without the usage key
	}
	v := gjson.Get(alias(data), s.path)
	if !v.Exists() {
		return // e.g. "[DONE]", or a delta without usage
	}
	s.cost, s.found = number(v)
}
