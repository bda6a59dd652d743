package rulestore

// The Redis backend. All keys share the hash tag {rl:rules} so a new version is written,
// made current, logged and announced by one script, atomically, on a cluster too:
//
//	{rl:rules}:current   the current version number
//	{rl:rules}:v:<n>     version n's JSON (immutable)
//	{rl:rules}:log       newest-first list of version records (JSON)
//	channel rl:rules     PUBLISH <n> when n becomes current

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

// Redis names.
const (
	currentKey = "{rl:rules}:current"
	logKey     = "{rl:rules}:log"
	// RedisChannel is the pub/sub channel a new current version is announced on.
	RedisChannel = "rl:rules"
)

func bodyKey(v uint64) string { return "{rl:rules}:v:" + strconv.FormatUint(v, 10) }

//go:embed put.lua
var putSrc string

var putScript = redis.NewScript(putSrc)

// Redis reads and writes rule-set versions in Redis.
type Redis struct {
	rdb redis.UniversalClient
}

// NewRedis returns the rule store on rdb.
func NewRedis(rdb redis.UniversalClient) *Redis { return &Redis{rdb: rdb} }

// CurrentVersion returns the current version (0: none yet).
func (s *Redis) CurrentVersion(ctx context.Context) (uint64, error) {
	v, err := s.rdb.Get(ctx, currentKey).Uint64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("rules: current version: %w", err)
	}
	return v, nil
}

// Get returns version v's body.
func (s *Redis) Get(ctx context.Context, v uint64) (*Set, error) {
	if v == 0 {
		return &Set{Body: []byte(EmptyBody)}, nil
	}
	b, err := s.rdb.Get(ctx, bodyKey(v)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, v)
	}
	if err != nil {
		return nil, fmt.Errorf("rules: version %d: %w", v, err)
	}
	return &Set{Version: v, Body: b}, nil
}

// Current returns the current version's body.
func (s *Redis) Current(ctx context.Context) (*Set, error) {
	v, err := s.CurrentVersion(ctx)
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, v)
}

// Put makes body (a JSON rule set) the next version (NextVersion) if base is still
// current, and announces it. It returns ErrConflict otherwise, and an error wrapping
// ErrInvalid and the parser's *rule.Errors when body is not a rule set rule.Parse
// accepts (the one definition of a valid rule set: the filter and the service's sync
// path parse each version with it too).
func (s *Redis) Put(ctx context.Context, base uint64, body []byte, rec Record) (uint64, error) {
	if _, err := rule.Parse(body); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	v := NextVersion(base, time.Now())
	body, err := WithVersion(body, v)
	if err != nil {
		return 0, err
	}
	return s.put(ctx, base, &Set{Version: v, Body: body}, rec)
}

// put writes set (its body's "version" already set.Version) as the version after base.
func (s *Redis) put(ctx context.Context, base uint64, set *Set, rec Record) (uint64, error) {
	v := set.Version
	rec.Version, rec.Size = v, len(set.Body)
	if rec.At.IsZero() {
		rec.At = time.Now().UTC()
	}
	entry, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("rules: record: %w", err)
	}
	res, err := putScript.Run(ctx, s.rdb, []string{currentKey, logKey, bodyKey(v)},
		base, set.Body, entry, RedisChannel, Keep, v).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("rules: put version %d: %w", v, err)
	}
	if len(res) != 2 || res[1] < 0 {
		return 0, fmt.Errorf("rules: put version %d: unexpected reply %v", v, res)
	}
	if res[0] != 1 {
		return uint64(res[1]), fmt.Errorf("%w: base %d, current %d", ErrConflict, base, res[1])
	}
	return v, nil
}

// Install makes set, a version kept elsewhere (the durable policy store, package
// rulestore/postgres), current in Redis unless Redis already holds it or a newer one,
// and announces it. It reports whether it wrote. This is how a version written to the
// policy store reaches Redis, and how the active version comes back after Redis lost its
// data.
func (s *Redis) Install(ctx context.Context, set *Set, rec Record) (bool, error) {
	if _, err := rule.Parse(set.Body); err != nil {
		return false, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := s.CurrentVersion(ctx)
		if err != nil {
			return false, err
		}
		if cur >= set.Version {
			return false, nil
		}
		if _, err = s.put(ctx, cur, set, rec); err == nil {
			return true, nil
		}
		if !errors.Is(err, ErrConflict) {
			return false, err
		}
	}
	return false, fmt.Errorf("%w: installing version %d", ErrConflict, set.Version)
}

// Versions returns the version records, newest first.
func (s *Redis) Versions(ctx context.Context) ([]Record, error) {
	raw, err := s.rdb.LRange(ctx, logKey, 0, Keep-1).Result()
	if err != nil {
		return nil, fmt.Errorf("rules: versions: %w", err)
	}
	out := make([]Record, 0, len(raw))
	for _, r := range raw {
		var rec Record
		if err := json.Unmarshal([]byte(r), &rec); err == nil {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Update applies change to the current body and stores the result as a new version,
// retrying (a bounded number of times) when another writer got there first. change
// returns the new body, or an error that Update returns unchanged.
func (s *Redis) Update(ctx context.Context, rec Record, change func(cur *Set) ([]byte, error)) (uint64, error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var cur *Set
		if cur, err = s.Current(ctx); err != nil {
			return 0, err
		}
		var body []byte
		if body, err = change(cur); err != nil {
			return 0, err
		}
		var v uint64
		if v, err = s.Put(ctx, cur.Version, body, rec); err == nil {
			return v, nil
		}
		if !errors.Is(err, ErrConflict) {
			return 0, err
		}
	}
	return 0, err
}
