// Package rulestore keeps the service's rule sets as immutable numbered versions, each
// with a record of who wrote it, when, how and why. It has two backends of one model:
//
//   - Redis (this package: Redis, Watcher) is what the service serves from. Every
//     service instance learns the current version within 100 ms; gateways learn it
//     from every sync reply and fetch the body when it changed, so a rule change
//     reaches the fleet in one sync interval plus one fetch.
//   - PostgreSQL (package rulestore/postgres), optional, is the durable source of
//     truth: a change is committed there first and then installed into Redis, which
//     can be given its rules back after it lost its data.
//
// Both share what a version is (Set, Record), how the next one is numbered
// (NextVersion, WithVersion) and the errors a writer sees (ErrConflict, ErrInvalid,
// ErrNotFound).
//
// Versions only grow: a rollback writes the old body again as a new version, so
// "newer than mine" is all a gateway or instance has to check. A new version is the
// larger of the current one plus one and the writer's clock in Unix milliseconds, so
// versions keep growing across a wipe of Redis (FLUSHALL, a new cluster): a rule set
// written afterwards is newer than anything a gateway enforces, and a stale one can
// never look current.
package rulestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Keep is how many versions stay available for rollback.
const Keep = 100

// Record describes one version.
type Record struct {
	Version uint64    `json:"version"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
	Action  string    `json:"action"` // "put", "rollback", "allow", "deny"
	From    uint64    `json:"from,omitempty"`
	Size    int       `json:"size"`
	Reason  string    `json:"reason,omitempty"` // why, as the author said (X-Tollgate-Reason)
}

// Set is one version's body.
type Set struct {
	Version uint64
	Body    []byte // JSON with "version" set to Version
}

// ErrConflict: the current version moved while a change was being prepared.
var ErrConflict = errors.New("rules: version changed concurrently")

// ErrInvalid is wrapped, with the *rule.Errors that says why, by Put (and so Update)
// when a body is not a valid rule set: whoever writes, nothing a gateway could not
// enforce becomes a version.
var ErrInvalid = errors.New("rules: invalid rule set")

// ErrNotFound: no such version (never written, or older than Keep versions).
var ErrNotFound = errors.New("rules: version not found")

// EmptyBody is version 0, served before any PUT: no rules, no lists.
const EmptyBody = `{"version":0}`

// WithVersion returns body (a JSON object) with its top-level "version" set to v.
func WithVersion(body []byte, v uint64) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("rules: body is not a JSON object: %w", err)
	}
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	m["version"] = json.RawMessage(strconv.FormatUint(v, 10))
	return json.Marshal(m)
}

// NextVersion is the version a rule set written on top of base at now gets: base+1, or
// the Unix millisecond of now when that is larger (versions survive a wipe of Redis).
func NextVersion(base uint64, now time.Time) uint64 {
	return max(base+1, uint64(max(now.UnixMilli(), 0)))
}
