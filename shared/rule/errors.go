package rule

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// FieldError is a validation error: Field is the JSON path of the offending value
// (e.g. "rules[2].limit"; "" for the document as a whole, which Error calls
// "configuration") and Msg says what is wrong with
// it, quoting the value. Err is the underlying cause when there is one (a regexp or
// duration parse error).
type FieldError struct {
	Field string
	Msg   string
	Err   error
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "configuration: " + e.Msg
	}
	return e.Field + ": " + e.Msg
}

func (e *FieldError) Unwrap() error { return e.Err }

func fieldErrorf(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// show renders an offending JSON value for an error message: compacted (whitespace
// outside strings dropped) and shortened so a huge value cannot flood a log line.
func show(v gjson.Result) string {
	raw := v.Raw
	var b strings.Builder
	inString, escaped := false, false
	for i := 0; i < len(raw) && b.Len() <= maxShownValue; i++ {
		c := raw[i]
		switch {
		case inString:
			inString = escaped || c != '"'
			escaped = !escaped && c == '\\'
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		b.WriteByte(c)
	}
	if out := b.String(); len(out) > maxShownValue {
		return out[:maxShownValue] + "..."
	}
	return b.String()
}

func quoteShort(s string) string {
	if len(s) > maxShownValue {
		return strconv.Quote(s[:maxShownValue]) + "..."
	}
	return strconv.Quote(s)
}

func typeError(path, want string, v gjson.Result) *FieldError {
	return fieldErrorf(path, "must be %s, got %s", want, show(v))
}

func rangeError(path string, lo int64, raw string) *FieldError {
	if len(raw) > maxShownValue {
		raw = raw[:maxShownValue] + "..."
	}
	if lo == 1 {
		return fieldErrorf(path, "must be > 0, got %s", raw)
	}
	return fieldErrorf(path, "must be >= %d, got %s", lo, raw)
}
