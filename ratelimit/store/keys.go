package store

import (
	"github.com/tollgate-rl/tollgate/internal/hashslot"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// KeyPrefix is the part every Redis key of one caller key starts with: "rl:{<key>}".
// The braces are the Redis Cluster hash tag, so a caller's buckets and its penalty
// record share a slot and one script call may touch them all (RATIONALE.md §5).
//
// A caller key is chosen by clients (an API key header), so it may contain '}' or be
// empty, either of which would end the hash tag early or leave it empty: the bucket and
// penalty keys would then hash to different slots (CROSSSLOT) and two callers could
// collide. Such keys get the tag "~<xxhash64 hex>" and carry the raw key, length-
// prefixed, after the tag: "rl:{~<hex>}<len>:<key>". A normal tag is followed by ':'
// and this one by a digit, so the two forms never produce the same name.
func KeyPrefix(key string) string {
	if key != "" && !strings.ContainsRune(key, '}') {
		return "rl:{" + key + "}"
	}
	return "rl:{~" + strconv.FormatUint(xxhash.Sum64String(key), 16) + "}" + strconv.Itoa(len(key)) + ":" + key
}

// BucketKey is the hash of one (caller key, rule, window) bucket.
func BucketKey(key, rule string, window uint8) string {
	return KeyPrefix(key) + ":" + rule + ":" + strconv.Itoa(int(window))
}

// PenaltyKey is the caller key's progressive-penalty hash.
func PenaltyKey(key string) string { return KeyPrefix(key) + ":penalty" }

// nodesKey is the sorted set of gateways by last sync (unix ms), for the fleet size.
const nodesKey = "rl:nodes"

// splitBucketKey returns the rule and window of a bucket key under prefix.
func splitBucketKey(prefix, redisKey string) (rule string, window int, ok bool) {
	rest, found := strings.CutPrefix(redisKey, prefix+":")
	if !found {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return "", 0, false
	}
	w, err := strconv.Atoi(rest[i+1:])
	if err != nil || w < 0 || w > 255 {
		return "", 0, false
	}
	return rest[:i], w, true
}

// globEscape escapes s for a SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Slot is the Redis Cluster hash slot of key.
func Slot(key string) int { return hashslot.Of(key) }
