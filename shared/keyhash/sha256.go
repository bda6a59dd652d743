package keyhash

import (
	"encoding/binary"
	"math/bits"
)

// sha256K are SHA-256's round constants (FIPS 180-4, 4.2.2).
var sha256K = [64]uint32{
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

// sum256 is SHA-256 (FIPS 180-4) of s, on the stack.
func sum256(s string) [32]byte {
	var d digest
	d.reset()
	d.write(s)
	return d.sum()
}

// digest is a running SHA-256 (for HMAC, which hashes a key block and then the message).
type digest struct {
	h     [8]uint32
	block [64]byte
	nx    int    // bytes in block
	n     uint64 // bytes written
}

func (d *digest) reset() {
	d.h = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
	d.nx, d.n = 0, 0
}

func (d *digest) write(s string) {
	d.n += uint64(len(s))
	for len(s) > 0 {
		k := copy(d.block[d.nx:], s)
		d.nx += k
		s = s[k:]
		if d.nx == 64 {
			compress(&d.h, &d.block)
			d.nx = 0
		}
	}
}

func (d *digest) writeBytes(b []byte) {
	d.n += uint64(len(b))
	for len(b) > 0 {
		k := copy(d.block[d.nx:], b)
		d.nx += k
		b = b[k:]
		if d.nx == 64 {
			compress(&d.h, &d.block)
			d.nx = 0
		}
	}
}

// sum pads and returns the hash (the digest is spent).
func (d *digest) sum() [32]byte {
	// Padding: 0x80, zeros, then the length in bits (big-endian) in the last 8 bytes of
	// the last block — a second block when fewer than 9 bytes are left in this one.
	k := d.nx
	d.block[k] = 0x80
	clear(d.block[k+1:])
	if k >= 56 {
		compress(&d.h, &d.block)
		clear(d.block[:])
	}
	binary.BigEndian.PutUint64(d.block[56:], d.n*8)
	compress(&d.h, &d.block)
	var out [32]byte
	for i, v := range d.h {
		binary.BigEndian.PutUint32(out[4*i:], v)
	}
	return out
}

func compress(h *[8]uint32, p *[64]byte) {
	var w [64]uint32
	for i := 0; i < 16; i++ {
		w[i] = binary.BigEndian.Uint32(p[4*i:])
	}
	for i := 16; i < 64; i++ {
		s0 := bits.RotateLeft32(w[i-15], -7) ^ bits.RotateLeft32(w[i-15], -18) ^ w[i-15]>>3
		s1 := bits.RotateLeft32(w[i-2], -17) ^ bits.RotateLeft32(w[i-2], -19) ^ w[i-2]>>10
		w[i] = w[i-16] + s0 + w[i-7] + s1
	}
	a, b, c, d, e, f, g, hh := h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
	for i := 0; i < 64; i++ {
		s1 := bits.RotateLeft32(e, -6) ^ bits.RotateLeft32(e, -11) ^ bits.RotateLeft32(e, -25)
		ch := e&f ^ ^e&g
		t1 := hh + s1 + ch + sha256K[i] + w[i]
		s0 := bits.RotateLeft32(a, -2) ^ bits.RotateLeft32(a, -13) ^ bits.RotateLeft32(a, -22)
		maj := a&b ^ a&c ^ b&c
		t2 := s0 + maj
		hh, g, f, e, d, c, b, a = g, f, e, d+t1, c, b, a, t1+t2
	}
	h[0] += a
	h[1] += b
	h[2] += c
	h[3] += d
	h[4] += e
	h[5] += f
	h[6] += g
	h[7] += hh
}
