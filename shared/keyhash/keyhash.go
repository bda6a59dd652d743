// Package keyhash names a caller key without revealing it: the first 8 bytes of its
// SHA-256, in hex, or, with the deployment's key-hash secret, its keyed name (AppendKeyed:
// the name the sync service gives the key in Redis, its logs and /v1/top). Caller keys are personal data (and often credentials), so logs, hot-key
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

// KeyedLen is the length of a keyed name in base64url characters (96 bits).
const KeyedLen = 16

// AppendKeyed appends key's keyed name under secret to dst: HMAC-SHA256(secret, key),
// its first 12 bytes in unpadded base64url — the sync service's HashKey, so the filter's
// access-log metadata and the service's logs, Redis keys and /v1/top name a key the
// same way. An unkeyed name of an IP address is reversed by hashing the 2^32 candidates;
// without the secret a keyed one is not. It allocates nothing when dst has room.
func AppendKeyed(dst []byte, secret, key string) []byte {
	var k [64]byte
	if len(secret) > 64 {
		sum := sum256(secret)
		copy(k[:], sum[:])
	} else {
		copy(k[:], secret)
	}
	var pad [64]byte
	for i := range k {
		pad[i] = k[i] ^ 0x36
	}
	var d digest
	d.reset()
	d.writeBytes(pad[:])
	d.write(key)
	inner := d.sum()
	for i := range k {
		pad[i] = k[i] ^ 0x5c
	}
	d.reset()
	d.writeBytes(pad[:])
	d.writeBytes(inner[:])
	mac := d.sum()
	// Unpadded base64url of 12 bytes: four groups of 3 bytes, 4 characters each (the
	// filter links no encoding/base64 for 16 characters).
	const b64url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := 0; i < 12; i += 3 {
		v := uint32(mac[i])<<16 | uint32(mac[i+1])<<8 | uint32(mac[i+2])
		dst = append(dst, b64url[v>>18&63], b64url[v>>12&63], b64url[v>>6&63], b64url[v&63])
	}
	return dst
}
