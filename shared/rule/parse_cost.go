package rule

import (
	"strings"

	"github.com/tidwall/gjson"
)

// Response-based cost bounds.
const (
	// DefaultMaxBodyBytes is how much of a response body the filter keeps to find the
	// cost field when cost_from.max_body_bytes is not set: a whole JSON body up to
	// this size, else its last this many bytes; one server-sent event's data line.
	DefaultMaxBodyBytes = 64 << 10
	// MinMaxBodyBytes and MaxMaxBodyBytes bound cost_from.max_body_bytes. The upper
	// bound is per open stream of the rule: a worker with many such streams open holds
	// that much each.
	MinMaxBodyBytes = 1 << 10
	MaxMaxBodyBytes = 4 << 20
	// maxCostPathBytes bounds cost_from.body (a gjson path).
	maxCostPathBytes = 256
)

// CostFrom takes a request's cost from its response: a response header, or a field of
// the JSON body (or of the last server-sent event carrying it). The rule's cost is the
// estimate charged when the request is admitted; when the response ends, what the
// response reports beyond it is charged too (the bucket may go into debt, which later
// requests repay). A response reporting less is still charged the estimate: it is the
// minimum.
type CostFrom struct {
	// Header is a response header name (lower case) whose value is the cost.
	Header string
	// Body is a gjson path into the JSON response body ("usage.total_tokens"); for a
	// text/event-stream response, into the data of the last event that has it.
	Body string
	// MaxBodyBytes bounds what of the body is kept (see DefaultMaxBodyBytes).
	MaxBodyBytes int
}

// parseCostFrom reads a rule's cost_from: exactly one of header and body.
func parseCostFrom(path string, v gjson.Result) (*CostFrom, error) {
	o, err := parseObject(path, v, "header", "body", "max_body_bytes")
	if err != nil {
		return nil, err
	}
	c := &CostFrom{MaxBodyBytes: DefaultMaxBodyBytes}
	var errs errList
	switch {
	case o.has("header") && o.has("body"):
		return nil, fieldError(o.at("body"), "cannot be combined with \"header\": the cost comes from one place")
	case o.has("header"):
		c.Header, err = parseHeaderName(o.at("header"), o.get("header"))
		errs.add(err)
		if o.has("max_body_bytes") {
			errs.add(fieldError(o.at("max_body_bytes"), "only applies to \"body\""))
		}
	case o.has("body"):
		c.Body, err = parseCostPath(o.at("body"), o.get("body"))
		errs.add(err)
	default:
		return nil, fieldError(o.at("header"), "required (or \"body\")")
	}
	if mv := o.get("max_body_bytes"); mv.Exists() && c.Body != "" {
		n, err := parseInt(o.at("max_body_bytes"), mv, MinMaxBodyBytes, MaxMaxBodyBytes)
		errs.add(err)
		c.MaxBodyBytes = int(n)
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return c, nil
}

// parseCostPath reads a gjson path of plain keys and array indexes separated by dots
// ("usage.total_tokens", "choices.0.usage.tokens"): gjson's modifiers, wildcards and
// queries are refused, because a cost must name one number.
func parseCostPath(path string, v gjson.Result) (string, error) {
	s, err := parseString(path, v)
	if err != nil {
		return "", err
	}
	if s == "" || len(s) > maxCostPathBytes {
		return "", fieldError(path, "must be 1.."+itoa(maxCostPathBytes)+" bytes, got "+itoa(len(s)))
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" {
			return "", fieldError(path, "invalid path "+quoteShort(s)+": want keys separated by \".\"")
		}
		for i := 0; i < len(part); i++ {
			if b := part[i]; b < ' ' || b == 0x7f || strings.IndexByte("*?|#@!\\=<>%,[]{}()\"' ", b) >= 0 {
				return "", fieldError(path, "invalid path "+quoteShort(s)+": want plain keys and indexes separated by \".\" (no wildcards, queries or modifiers)")
			}
		}
	}
	return s, nil
}
