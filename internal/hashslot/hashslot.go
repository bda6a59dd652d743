// Package hashslot computes Redis Cluster hash slots. go-redis has the same function but
// keeps it in an internal package, so the service (grouping a batch by slot) and the test
// harness (finding the primary that owns a key) share this one copy.
package hashslot

import "strings"

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// Of is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag (the part
// between the first "{" and the next "}", when not empty), mod 16384.
func Of(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % Slots
}
