// Package keyhash names a caller key without revealing it: the first 8 bytes of its
// SHA-256, in hex. Caller keys are personal data (and often credentials), so logs, hot-key
// lists and the filter's access-log metadata carry this name instead; one function for all
// of them lets an operator join a refused request's access-log line to its entry in the
// service's /v1/top.
package keyhash

import (
	"crypto/sha256"
	"encoding/hex"
	"unsafe"
)

// Len is the length of a key's name in hex characters.
const Len = 16

// Append appends key's name to dst. It allocates nothing when dst has room (the filter
// formats it on every request).
func Append(dst []byte, key string) []byte {
	// The key's bytes are only read: no copy of the string.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(key), len(key)))
	var out [Len]byte
	hex.Encode(out[:], sum[:Len/2])
	return append(dst, out[:]...)
}

// String is the key's name as a string.
func String(key string) string { return string(Append(make([]byte, 0, Len), key)) }
