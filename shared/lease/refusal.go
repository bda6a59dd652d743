package lease

import "github.com/tollgate-rl/tollgate/shared/wire"

// Refusal returns why the service cannot apply delta d ("" when it can): what the wire
// decoder cannot check — a key and a rule to name the bucket by, and parameters the
// algorithms accept (algo.Params.Validate). Every backend of the service refuses a delta
// for these reasons and no other of its own (internal/backend.Screen), so a gateway gets
// the same answer from Redis and from the in-memory service. The reason fits
// wire.MaxTagLen.
func Refusal(d *wire.Delta) string {
	switch {
	case d.Key == "":
		return "key: empty"
	case d.Rule == "":
		return "rule: empty"
	}
	if err := ParamsOf(d).Validate(); err != nil {
		return TruncateReason("params: " + err.Error())
	}
	return ""
}

// TruncateReason cuts a refusal reason to what a wire State carries (wire.MaxTagLen).
func TruncateReason(s string) string {
	if len(s) > wire.MaxTagLen {
		return s[:wire.MaxTagLen]
	}
	return s
}
