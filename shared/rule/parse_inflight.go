package rule

// MaxInFlight bounds max_in_flight: a gateway keeps one count per caller key and
// worker, and more concurrent streams than this per key is no cap at all.
const MaxInFlight = 1_000_000

// concurrencyOnly reports whether rule object o caps concurrency alone: it has
// max_in_flight and none of the rate-limit fields, so it needs no windows.
func concurrencyOnly(o *object) bool {
	return o.has("max_in_flight") && !o.has("limit") && !o.has("window") && !o.has("burst") && !o.has("windows")
}

// parseInFlight reads a rule's max_in_flight. A rule without a rate limit (only
// max_in_flight) takes none of the fields that modify one, and max_in_flight is refused
// with descriptors: Envoy's rate limit service API asks once per request and never
// says when the request ends, so a slot taken there could not be given back.
func parseInFlight(o *object, r *Rule) error {
	v := o.get("max_in_flight")
	if !v.Exists() {
		return nil
	}
	n, err := parseInt(o.at("max_in_flight"), v, 1, MaxInFlight)
	if err != nil {
		return err
	}
	if o.has("descriptors") {
		return fieldError(o.at("max_in_flight"), "cannot be combined with \"descriptors\": the rate limit service API does not say when a request ends")
	}
	if concurrencyOnly(o) {
		var errs errList
		for _, f := range [...]string{"tiers", "overrides", "degraded_limit", "costs", "cost", "strict"} {
			if o.has(f) && (f != "strict" || r.Strict) {
				errs.add(fieldError(o.at(f), "needs a rate limit (\"limit\" and \"window\", or \"windows\"); the rule has only \"max_in_flight\""))
			}
		}
		if err := errs.err(); err != nil {
			return err
		}
	}
	r.MaxInFlight = n
	return nil
}
