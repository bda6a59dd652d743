package refusal

import "strconv"

// Concurrency refusals (a rule's max_in_flight): a 429 like a rate-limit refusal, with
// its own code and reason so that a client can tell "too many at once" (retry as soon
// as one of its requests ends) from "too many per window" (wait for the reset).
const (
	// CodeConcurrency is the code of a 429 for too many requests in flight.
	CodeConcurrency = "CONCURRENCY_LIMIT_EXCEEDED"
	// ReasonConcurrency is the body's details.reason of that 429.
	ReasonConcurrency = "concurrency"
)

// AppendBodyConcurrency appends the body of a refusal by a rule's max_in_flight:
//
//	{"error":{"code":"CONCURRENCY_LIMIT_EXCEEDED","message":"Concurrency limit of 20
//	requests in flight exceeded","details":{"reason":"concurrency","max_in_flight":20,
//	"retry_after_seconds":1,"rule":"llm"}}}
//
// limit is what the gateway enforces (its share of the rule's max_in_flight).
func AppendBodyConcurrency(dst []byte, limit, retryAfterSeconds int64, rule string) []byte {
	dst = append(dst, `{"error":{"code":"`+CodeConcurrency+`","message":"Concurrency limit of `...)
	dst = strconv.AppendInt(dst, limit, 10)
	if limit == 1 {
		dst = append(dst, " request"...)
	} else {
		dst = append(dst, " requests"...)
	}
	dst = append(dst, ` in flight exceeded","details":{"reason":"`+ReasonConcurrency+`","max_in_flight":`...)
	dst = strconv.AppendInt(dst, limit, 10)
	dst = append(dst, `,"retry_after_seconds":`...)
	dst = strconv.AppendInt(dst, retryAfterSeconds, 10)
	dst = append(dst, `,"rule":`...)
	dst = appendJSONString(dst, rule)
	return append(dst, "}}}"...)
}
