package rule

import (
	"errors"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// FieldError is a validation error: Field is the JSON path of the offending value
// (e.g. "rules[2].limit"; "" for the document as a whole, which Error calls
// "configuration") and Msg says what is wrong with it, quoting the value. Err is the
// underlying cause when there is one (a regexp, an IP address, algo.ParamError).
//
// Errors are built with strconv and strings, not fmt: this package is compiled into the
// filter's wasm module, and fmt (with the reflection and os it pulls in) would be most
// of that module's size.
type FieldError struct {
	Field string
	Msg   string
	Err   error
	// Offset is, for a document that is not JSON (Syntax true), the byte offset at which
	// it stops being JSON.
	Offset int
	Syntax bool
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "configuration: " + e.Msg
	}
	return e.Field + ": " + e.Msg
}

func (e *FieldError) Unwrap() error { return e.Err }

func fieldError(field, msg string) *FieldError { return &FieldError{Field: field, Msg: msg} }

// MaxErrors is how many errors Parse reports at most: enough to fix a rule file in one
// pass, bounded so a generated file with a million mistakes cannot flood a log line or
// an API answer.
const MaxErrors = 20

// Errors is what Parse returns for an invalid rule set: every error found, in the
// order Parse checks the document (top-level fields, lists, tiers, then each rule in
// turn), at most MaxErrors (Truncated says there were more). Parse keeps going after an
// error wherever the rest of the document still means something on its own (other
// rules, windows, list entries, sections, each field of a window and of the sync block,
// unknown fields), so one run names every mistake.
// errors.As(err, &fieldErr) finds the first.
type Errors struct {
	List      []*FieldError
	Truncated bool
}

func (e *Errors) Error() string {
	var b strings.Builder
	for i, fe := range e.List {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(fe.Error())
	}
	if e.Truncated {
		b.WriteString("; (more errors not shown)")
	}
	return b.String()
}

// Unwrap gives errors.As and errors.Is every FieldError.
func (e *Errors) Unwrap() []error {
	out := make([]error, len(e.List))
	for i, fe := range e.List {
		out[i] = fe
	}
	return out
}

// All returns the FieldErrors of an error returned by Parse (nil for nil).
func All(err error) []*FieldError {
	var es *Errors
	if errors.As(err, &es) {
		return es.List
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return []*FieldError{fe}
	}
	if err != nil {
		return []*FieldError{{Msg: err.Error(), Err: err}}
	}
	return nil
}

// errList collects the errors of independent parts of a document.
type errList struct {
	list      []*FieldError
	truncated bool
}

// add records err (a *FieldError or *Errors; nil is ignored) and reports whether it was
// an error.
func (l *errList) add(err error) bool {
	if err == nil {
		return false
	}
	for _, fe := range All(err) {
		if len(l.list) == MaxErrors {
			l.truncated = true
			break
		}
		l.list = append(l.list, fe)
	}
	var es *Errors
	if errors.As(err, &es) && es.Truncated {
		l.truncated = true
	}
	return true
}

// err returns the collected errors as an *Errors, or nil.
func (l *errList) err() error {
	if len(l.list) == 0 {
		return nil
	}
	return &Errors{List: l.list, Truncated: l.truncated}
}

func itoa[T int | int64](v T) string { return strconv.FormatInt(int64(v), 10) }

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
	return fieldError(path, "must be "+want+", got "+show(v))
}

func rangeError(path string, lo int64, raw string) *FieldError {
	if len(raw) > maxShownValue {
		raw = raw[:maxShownValue] + "..."
	}
	if lo == 1 {
		return fieldError(path, "must be > 0, got "+raw)
	}
	return fieldError(path, "must be >= "+itoa(lo)+", got "+raw)
}
