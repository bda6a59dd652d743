package lease

import (
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/algo"
)

// FormatParams encodes p as "kind:limit:window_us:burst" (the service's registry of the
// buckets it has seen).
func FormatParams(p algo.Params) string {
	return strconv.Itoa(int(p.Kind)) + ":" + strconv.FormatInt(p.Limit, 10) + ":" +
		strconv.FormatInt(p.WindowUs, 10) + ":" + strconv.FormatInt(p.Burst, 10)
}

// ParseParams decodes FormatParams.
func ParseParams(s string) (algo.Params, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return algo.Params{}, false
	}
	var v [4]int64
	for i, x := range parts {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil || n < 0 {
			return algo.Params{}, false
		}
		v[i] = n
	}
	if v[0] > 255 {
		return algo.Params{}, false
	}
	return algo.Params{Kind: algo.Kind(v[0]), Limit: v[1], WindowUs: v[2], Burst: v[3]}, true
}
