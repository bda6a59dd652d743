package rule

import (
	"strconv"

	"github.com/tidwall/gjson"
)

// checkSyntax reports where data stops being JSON, or nil when it is JSON nested at most
// maxNesting deep.
//
// gjson's validator says only yes or no, and encoding/json (which reports an offset)
// would pull fmt and reflection into the filter's wasm module, so this small scanner of
// RFC 8259 exists to name the byte, line and column of the first mistake. It runs
// before gjson sees the document: it is iterative, so absurd nesting is refused before
// gjson's recursive validator runs, and gjson then only confirms.
func checkSyntax(data []byte) *FieldError {
	s := scanner{data: data}
	if s.document() && gjson.ValidBytes(data) {
		return nil
	}
	if s.msg == "" {
		// The scanner found nothing gjson refuses: report the whole document.
		s.pos, s.msg = 0, "not accepted by the JSON reader"
	}
	line, col := 1, 1
	for _, b := range data[:min(s.pos, len(data))] {
		if b == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return &FieldError{
		Msg:    "invalid JSON at line " + itoa(line) + ", column " + itoa(col) + " (byte " + itoa(s.pos) + "): " + s.msg,
		Offset: s.pos, Syntax: true,
	}
}

type scanner struct {
	data  []byte
	pos   int
	depth int
	msg   string // first error; pos is where it is
}

func (s *scanner) fail(msg string) bool {
	if s.msg == "" {
		s.msg = msg
	}
	return false
}

// unexpected names the byte at pos (or the end of the input).
func (s *scanner) unexpected(want string) bool {
	if s.pos >= len(s.data) {
		return s.fail("unexpected end of input, want " + want)
	}
	return s.fail("unexpected " + strconv.QuoteRune(rune(s.data[s.pos])) + ", want " + want)
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) document() bool {
	s.ws()
	if !s.value() {
		return false
	}
	s.ws()
	if s.pos < len(s.data) {
		return s.unexpected("the end of the document")
	}
	return true
}

// value scans one JSON value. Objects and arrays nest by recursion, at most maxNesting
// deep.
func (s *scanner) value() bool {
	if s.pos >= len(s.data) {
		return s.unexpected("a value")
	}
	switch c := s.data[s.pos]; {
	case c == '{' || c == '[':
		if s.depth++; s.depth > maxNesting {
			return s.fail("nested deeper than " + itoa(maxNesting) + " levels")
		}
		ok := s.container(c)
		s.depth--
		return ok
	case c == '"':
		return s.string()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return s.unexpected("a value")
}

// container scans an object ({) or array ([) whose opening byte is at pos.
func (s *scanner) container(open byte) bool {
	closing := byte(']')
	if open == '{' {
		closing = '}'
	}
	s.pos++
	s.ws()
	if s.pos < len(s.data) && s.data[s.pos] == closing {
		s.pos++
		return true
	}
	for {
		if open == '{' {
			if s.pos >= len(s.data) || s.data[s.pos] != '"' {
				return s.unexpected("a field name")
			}
			if !s.string() {
				return false
			}
			s.ws()
			if s.pos >= len(s.data) || s.data[s.pos] != ':' {
				return s.unexpected("':'")
			}
			s.pos++
			s.ws()
		}
		if !s.value() {
			return false
		}
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == ',' {
			s.pos++
			s.ws()
			continue
		}
		if s.pos < len(s.data) && s.data[s.pos] == closing {
			s.pos++
			return true
		}
		return s.unexpected("',' or " + strconv.QuoteRune(rune(closing)))
	}
}

func (s *scanner) string() bool {
	s.pos++ // the opening quote
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return true
		case c < ' ':
			return s.fail("control character in a string (escape it)")
		case c == '\\':
			s.pos++
			if s.pos >= len(s.data) {
				return s.unexpected("an escape")
			}
			switch s.data[s.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				s.pos++
				for i := 0; i < 4; i++ {
					if s.pos >= len(s.data) || !isHex(s.data[s.pos]) {
						return s.unexpected("a hex digit of a \\u escape")
					}
					s.pos++
				}
			default:
				return s.unexpected("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)")
			}
		default:
			s.pos++
		}
	}
	return s.unexpected("'\"' closing the string")
}

func (s *scanner) digits() bool {
	start := s.pos
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		s.pos++
	}
	if s.pos == start {
		return s.unexpected("a digit")
	}
	return true
}

func (s *scanner) number() bool {
	if s.data[s.pos] == '-' {
		s.pos++
	}
	if s.pos < len(s.data) && s.data[s.pos] == '0' {
		s.pos++
	} else if !s.digits() {
		return false
	}
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		s.pos++
		if !s.digits() {
			return false
		}
	}
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

func (s *scanner) literal(word string) bool {
	for i := 0; i < len(word); i++ {
		if s.pos >= len(s.data) || s.data[s.pos] != word[i] {
			return s.unexpected(strconv.Quote(word))
		}
		s.pos++
	}
	return true
}
