package abi

import (
	"errors"
	"unsafe"
)

// errBadPairs reports a serialized header map that does not follow the spec's layout.
var errBadPairs = errors.New("proxy-wasm: malformed serialized header map")

// maxPairsLen bounds what EncodePairs produces: the ABI passes sizes as i32.
const maxPairsLen = 1<<31 - 1

// Serialized maps (the spec's "Serialization" section), little-endian:
//
//	u32 count
//	count x (u32 key_len, u32 value_len)
//	count x (key bytes, 0x00, value bytes, 0x00)
//
// An empty map is either zero bytes or a single 0x00 byte.

// DecodePairs appends the pairs serialized in buf to dst and returns the result.
//
// Allocation strategy: the strings alias buf (unsafe.String), nothing is copied, so the
// only allocation is growing dst, at most once, to the exact pair count. The caller
// must therefore hand over buf for good: the binding passes the buffer the host wrote
// through proxy_on_memory_allocate, which nobody else references or reuses. Malformed
// input (counts or lengths past the end, missing NUL separators) yields an error,
// never a panic.
func DecodePairs(dst [][2]string, buf []byte) ([][2]string, error) {
	if len(buf) == 0 || (len(buf) == 1 && buf[0] == 0) {
		return dst, nil
	}
	if len(buf) < 4 {
		return dst, errBadPairs
	}
	n := uint64(le32(buf))
	// Each pair needs 8 bytes of lengths and 2 NULs; reject counts the buffer cannot
	// hold before sizing anything from them.
	if n > uint64(len(buf)-4)/10 {
		return dst, errBadPairs
	}
	count := int(n)
	sizes := 4
	data := uint64(4 + 8*count)
	total := uint64(len(buf))
	if cap(dst)-len(dst) < count {
		grown := make([][2]string, len(dst), len(dst)+count)
		copy(grown, dst)
		dst = grown
	}
	for i := 0; i < count; i++ {
		klen := uint64(le32(buf[sizes:]))
		vlen := uint64(le32(buf[sizes+4:]))
		sizes += 8
		if data+klen+1+vlen+1 > total {
			return dst, errBadPairs
		}
		k := int(data)
		if buf[k+int(klen)] != 0 {
			return dst, errBadPairs
		}
		v := k + int(klen) + 1
		if buf[v+int(vlen)] != 0 {
			return dst, errBadPairs
		}
		dst = append(dst, [2]string{aliasString(buf, k, int(klen)), aliasString(buf, v, int(vlen))})
		data += klen + 1 + vlen + 1
	}
	return dst, nil
}

// PairsLen is the serialized size of pairs; an empty map still takes the 4-byte count,
// because some hosts (the SDK's emulator) cannot read a zero-length map.
func PairsLen(pairs [][2]string) int {
	n := 4
	for _, p := range pairs {
		n += 8 + len(p[0]) + 1 + len(p[1]) + 1
	}
	return n
}

// AppendPairs appends the serialization of pairs to dst. It returns ok=false, and dst
// unchanged, when the result would not fit the ABI's 32-bit sizes.
func AppendPairs(dst []byte, pairs [][2]string) ([]byte, bool) {
	size := PairsLen(pairs)
	if size > maxPairsLen-len(dst) {
		return dst, false
	}
	dst = appendLE32(dst, uint32(len(pairs)))
	for _, p := range pairs {
		dst = appendLE32(dst, uint32(len(p[0])))
		dst = appendLE32(dst, uint32(len(p[1])))
	}
	for _, p := range pairs {
		dst = append(dst, p[0]...)
		dst = append(dst, 0)
		dst = append(dst, p[1]...)
		dst = append(dst, 0)
	}
	return dst, true
}

// AppendPropertyPath appends a property path in the host's format: segments separated
// by NUL, no trailing NUL.
func AppendPropertyPath(dst []byte, path []string) []byte {
	for i, p := range path {
		if i > 0 {
			dst = append(dst, 0)
		}
		dst = append(dst, p...)
	}
	return dst
}

func aliasString(buf []byte, off, n int) string {
	if n == 0 {
		return ""
	}
	return unsafe.String(&buf[off], n)
}

func le32(b []byte) uint32 {
	_ = b[3]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func appendLE32(b []byte, v uint32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}
