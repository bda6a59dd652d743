package service

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/netip"

	"github.com/tollgate-rl/tollgate/shared/rule"
)

// keyHashBytes is how much of the HMAC-SHA256 a stored key keeps: 96 bits, 16 base64url
// characters. That is no longer than a typical IPv4 address in text, so hashed buckets
// cost Redis no more memory than raw ones (bench/perf measures both), and two of a
// billion caller keys collide with a chance of about 10^-11.
const keyHashBytes = 12

// HashKey is the keyed hash a caller key is stored under: HMAC-SHA256 with the
// deployment's key-hash secret, truncated to keyHashBytes, base64url. Without the secret
// nobody can map an IP or API key to its Redis key (a plain hash of the 2^32 IPv4
// addresses is reversed in seconds); with it the service finds a caller's buckets from
// the raw key (/v1/usage, /v1/reset).
func HashKey(secret []byte, key string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(key))
	var sum [sha256.Size]byte
	return base64.RawURLEncoding.EncodeToString(m.Sum(sum[:0])[:keyHashBytes])
}

// hashes reports whether a rule set's key_hashing covers key.
func hashes(mode rule.KeyHashing, key string) bool {
	switch mode {
	case rule.HashAllKeys:
		return true
	case rule.HashNoKeys:
		return false
	}
	_, err := netip.ParseAddr(key) // what an ip key source yields (canonical text)
	return err == nil
}

// storeKeyFunc returns the form caller keys take in Redis under cfg's key_hashing (the
// default, hashing IP keys, when no rule set is stored), or nil when keys are stored
// raw: no key-hash secret is configured.
func (s *Service) storeKeyFunc(cfg *rule.Config) func(string) string {
	if len(s.cfg.KeyHashSecret) == 0 {
		return nil
	}
	mode := rule.HashIPKeys
	if cfg != nil {
		mode = cfg.KeyHashing
	}
	if mode == rule.HashNoKeys {
		return nil
	}
	secret := s.cfg.KeyHashSecret
	return func(key string) string {
		if hashes(mode, key) {
			return HashKey(secret, key)
		}
		return key
	}
}

// logKey is how a caller key appears in logs and the hot-key lists: its keyed hash
// with a key-hash secret (the same string Redis holds for a hashed key), else KeyHash.
// Both are hashes of every key, whatever key_hashing says: an operator does not need
// the key to read a log.
func (s *Service) logKey(key string) string {
	if len(s.cfg.KeyHashSecret) > 0 {
		return HashKey(s.cfg.KeyHashSecret, key)
	}
	return KeyHash(key)
}

// storeKey is the form of one caller key in Redis now (the admin API's usage and reset
// take the raw key).
func (s *Service) storeKey(ctx context.Context, key string) string {
	if f := s.storeKeyFunc(s.ruleSet(ctx)); f != nil {
		return f(key)
	}
	return key
}
