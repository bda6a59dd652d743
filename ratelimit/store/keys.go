package store

import (
	"strconv"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/tollgate-rl/tollgate/internal/hashslot"
)

// KeyPrefix is the part every Redis key of one caller key starts with: "tg:{<key>}".
// The braces are the Redis Cluster hash tag, so a caller's buckets and its penalty
// record share a slot and one script call may touch them all (RATIONALE.md §5).
//
// A caller key is chosen by clients (an API key header), so it may contain '}' or be
// empty, either of which would end the hash tag early or leave it empty: the bucket and
// penalty keys would then hash to different slots and two callers could collide. Such
// keys get the tag "~<xxhash64 hex>" and carry the raw key, length-prefixed, after the
// tag: "tg:{~<hex>}<len>:<key>". A normal tag is followed by ':' and this one by a
// digit, so the two forms never produce the same name.
func KeyPrefix(key string) string {
	if key != "" && !strings.ContainsRune(key, '}') {
		return "tg:{" + key + "}"
	}
	return "tg:{~" + strconv.FormatUint(xxhash.Sum64String(key), 16) + "}" + strconv.Itoa(len(key)) + ":" + key
}

// BucketKey is the string of one (caller key, rule, window) bucket, per tier: a caller
// whose tier changes starts a fresh bucket with the tier's limits.
func BucketKey(key, rule, tier string, window uint8) string {
	k := KeyPrefix(key) + ":" + rule + ":" + strconv.Itoa(int(window))
	if tier != "" {
		k += ":" + tier
	}
	return k
}

// NodeLeaseKey is the record of the leases the gateway tagged tag (lease.NodeTag) holds
// of one bucket (lease.SyncNode's own): the caller's prefix, then "|o:" where every
// bucket and penalty key has ':' (rule ids may hold ':'), so the names never meet.
func NodeLeaseKey(key, rule, tier string, window uint8, tag uint32) string {
	k := KeyPrefix(key) + "|o:" + strconv.FormatUint(uint64(tag)|1<<32, 16)[1:] + ":" + rule + ":" + strconv.Itoa(int(window))
	if tier != "" {
		k += ":" + tier
	}
	return k
}

// PenaltyKey is the caller key's progressive-penalty hash.
func PenaltyKey(key string) string { return KeyPrefix(key) + ":p" }

// idemKey is a gateway's idempotency hash on the Redis node that serves slot.
func idemKey(slot int, node string) string { return "tg:{" + slotTag(slot) + "}:q:" + node }

// NodesKey is the sorted set of gateways by last sync (unix ms), for the fleet size;
// the counter of this second's joins is NodesKey + ":joins:<unix s>" (same hash tag, so
// the fleet script's two keys share a slot on a cluster).
const NodesKey = "tg:{fleet}:nodes"

// paramsKey is the hash of every (rule, window, tier) the service has seen with its
// algorithm parameters: usage and reset of a caller key look its buckets up from it
// instead of scanning the keyspace.
const paramsKey = "tg:params"

// Slot is the Redis Cluster hash slot of key.
func Slot(key string) int { return hashslot.Of(key) }

// slotTags[s] is a short string whose hash slot is s (found by counting upward, once):
// a key "tg:{<slotTags[s]>}..." lands in slot s, so a record can be placed on the Redis
// node that serves a given slot.
var slotTags = sync.OnceValue(func() []string {
	t := make([]string, hashslot.Slots)
	left := hashslot.Slots
	for i := 0; left > 0; i++ {
		s := strconv.FormatUint(uint64(i), 36)
		if sl := hashslot.Of(s); t[sl] == "" {
			t[sl] = s
			left--
		}
	}
	return t
})

func slotTag(slot int) string { return slotTags()[slot] }
