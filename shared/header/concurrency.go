package header

// XConcurrencyLimit, on a refusal by a rule's max_in_flight (whose body package refusal
// formats), is the number of requests in flight this gateway admits for the caller
// under the rule that refused (its share of max_in_flight).
const XConcurrencyLimit = "x-ratelimit-concurrency-limit"

// ConcurrencyLimit adds XConcurrencyLimit.
func (b *Builder) ConcurrencyLimit(limit int64) { b.number(XConcurrencyLimit, limit) }
