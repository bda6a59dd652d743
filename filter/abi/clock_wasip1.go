//go:build wasip1

package abi

// clockTimeGet is WASI's clock_time_get, which the Go runtime imports already (so this
// adds no import to the module). time.Now calls it twice — the wall clock and the
// monotonic one — where the filter needs one reading.
//
//go:wasmimport wasi_snapshot_preview1 clock_time_get
func clockTimeGet(clockID uint32, precision uint64, time *uint64) uint32

// clockRealtime is WASI's CLOCKID_REALTIME.
const clockRealtime = 0

// nowNs is a package variable for the same reason as retPtr: a pointer passed to a
// //go:wasmimport function escapes.
var nowNs uint64

// NowUnixMicro reads the wall clock once (one clock_time_get). It returns 0 if the
// host refuses the call.
func NowUnixMicro() int64 {
	nowNs = 0
	if clockTimeGet(clockRealtime, 1000, &nowNs) != 0 {
		return 0
	}
	return int64(nowNs / 1000)
}
