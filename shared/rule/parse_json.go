package rule

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// object is a JSON object whose field names have been checked against the allowed
// set: unknown and duplicate fields are errors, and an explicit null reads as absent
// (generated configs often write null for "not set").
type object struct {
	path   string
	fields map[string]gjson.Result
}

// parseObject reads v as an object of the allowed fields. Every unknown or duplicate
// field is an error (all of them, up to MaxErrors). The object of the fields it
// accepted (the first of duplicates) is returned whenever v is an object, so a caller
// that wants every mistake of a small object (a window) can go on checking the rest.
func parseObject(path string, v gjson.Result, allowed ...string) (*object, error) {
	if !v.IsObject() {
		return nil, typeError(path, "an object", v)
	}
	o := &object{path: path, fields: make(map[string]gjson.Result, len(allowed))}
	var errs errList
	v.ForEach(func(k, val gjson.Result) bool {
		name := k.String()
		if !contains(allowed, name) {
			errs.add(fieldError(joinPath(path, name), "unknown field"))
			return !errs.truncated
		}
		if _, dup := o.fields[name]; dup {
			errs.add(fieldError(joinPath(path, name), "duplicate field"))
			return !errs.truncated
		}
		o.fields[name] = val
		return true
	})
	return o, errs.err()
}

func (o *object) get(name string) gjson.Result {
	v := o.fields[name]
	if v.Type == gjson.Null {
		return gjson.Result{}
	}
	return v
}

func (o *object) has(name string) bool { return o.get(name).Exists() }

func (o *object) at(name string) string { return joinPath(o.path, name) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// joinPath appends a field name to a JSON path; names that are not plain identifiers
// are written as ["name"] so the path stays unambiguous.
func joinPath(path, name string) string {
	plain := name != ""
	for i := 0; i < len(name); i++ {
		if !isIDByte(name[i]) {
			plain = false
			break
		}
	}
	if !plain {
		return path + "[" + strconv.Quote(name) + "]"
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

func parseString(path string, v gjson.Result) (string, error) {
	if v.Type != gjson.String {
		return "", typeError(path, "a string", v)
	}
	return v.Str, nil
}

func parseBool(path string, v gjson.Result) (bool, error) {
	if !v.IsBool() {
		return false, typeError(path, "true or false", v)
	}
	return v.Bool(), nil
}

// parseInt reads an integer in [lo, hi]. JSON numbers are read from their raw text,
// never through float64, so 1.5 and 1e3 are refused instead of rounded.
func parseInt(path string, v gjson.Result, lo, hi int64) (int64, error) {
	return parseIntWhy(path, v, lo, hi, "")
}

// parseIntWhy is parseInt whose "too large" error says why after the bound (" for ...").
func parseIntWhy(path string, v gjson.Result, lo, hi int64, why string) (int64, error) {
	if v.Type != gjson.Number {
		return 0, typeError(path, "an integer", v)
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil {
		if strings.ContainsAny(v.Raw, ".eE") {
			return 0, typeError(path, "an integer", v)
		}
		// Out of int64 range: report against the bound it broke.
		if strings.HasPrefix(v.Raw, "-") {
			return 0, rangeError(path, lo, v.Raw)
		}
		return 0, fieldError(path, "must be <= "+itoa(hi)+why+", got "+show(v))
	}
	if n < lo {
		return 0, rangeError(path, lo, v.Raw)
	}
	if n > hi {
		return 0, fieldError(path, "must be <= "+itoa(hi)+why+", got "+show(v))
	}
	return n, nil
}

func parseUint(path string, v gjson.Result) (uint64, error) {
	if v.Type != gjson.Number {
		return 0, typeError(path, "a non-negative integer", v)
	}
	n, err := strconv.ParseUint(v.Raw, 10, 64)
	if err != nil {
		if strings.HasPrefix(v.Raw, "-") {
			return 0, fieldError(path, "must be >= 0, got "+show(v))
		}
		if strings.ContainsAny(v.Raw, ".eE") {
			return 0, typeError(path, "a non-negative integer", v)
		}
		return 0, fieldError(path, "must be < 2^64, got "+show(v))
	}
	return n, nil
}

// parseArray returns the elements of a JSON array of at most max entries.
func parseArray(path string, v gjson.Result, max int) ([]gjson.Result, error) {
	if !v.IsArray() {
		return nil, typeError(path, "an array", v)
	}
	n := 0
	v.ForEach(func(_, _ gjson.Result) bool { n++; return n <= max })
	if n > max {
		return nil, fieldError(path, "has more than "+itoa(max)+" entries")
	}
	return v.Array(), nil
}

func parseStrings(path string, v gjson.Result, max int) ([]string, error) {
	elems, err := parseArray(path, v, max)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(elems))
	for i, e := range elems {
		s, err := parseString(indexPath(path, i), e)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
