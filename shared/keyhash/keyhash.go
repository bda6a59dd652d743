// Package keyhash names a caller key without revealing it: the first 8 bytes of its
// SHA-256, in hex. Caller keys are personal data (and often credentials), so logs, hot-key
// lists and the filter's access-log metadata carry this name instead; one function for all
// of them lets an operator join a refused request's access-log line to its entry in the
// service's /v1/top.
//
// The SHA-256 is this package's own (sha256.go), checked against crypto/sha256 by the
// tests: crypto/sha256 links the FIPS 140 module into the filter's wasm, about 270 KB for
// one hash of a short string per request.
package keyhash

// Len is the length of a key's name in hex characters.
const Len = 16

const hexDigits = "0123456789abcdef"

// Append appends key's name to dst. It allocates nothing when dst has room (the filter
// formats it on every request).
func Append(dst []byte, key string) []byte {
	sum := sum256(key)
	for _, b := range sum[:Len/2] {
		dst = append(dst, hexDigits[b>>4], hexDigits[b&0x0f])
	}
	return dst
}

// String is the key's name as a string.
func String(key string) string { return string(Append(make([]byte, 0, Len), key)) }
