//go:build !wasip1

package abi

import "time"

// Outside wasip1 there is no proxy host: every host call reports ErrUnimplemented and
// logging is dropped, so code that uses this package's types builds and tests natively.

func proxyLog(level uint32, msgData *byte, msgSize uint32) uint32 { return statusUnimplemented }

func proxyGetBufferBytes(bufferType, start, maxSize uint32, retData, retSize *uint32) uint32 {
	return statusUnimplemented
}

func proxyGetHeaderMapPairs(mapType uint32, retData, retSize *uint32) uint32 {
	return statusUnimplemented
}

func proxyGetHeaderMapValue(mapType uint32, keyData *byte, keySize uint32, retData, retSize *uint32) uint32 {
	return statusUnimplemented
}

func proxyAddHeaderMapValue(mapType uint32, keyData *byte, keySize uint32, valueData *byte, valueSize uint32) uint32 {
	return statusUnimplemented
}

func proxyReplaceHeaderMapValue(mapType uint32, keyData *byte, keySize uint32, valueData *byte, valueSize uint32) uint32 {
	return statusUnimplemented
}

func proxySendLocalResponse(statusCode uint32, detailsData *byte, detailsSize uint32,
	bodyData *byte, bodySize uint32, headersData *byte, headersSize uint32, grpcStatus int32) uint32 {
	return statusUnimplemented
}

func proxyGetSharedData(keyData *byte, keySize uint32, retData, retSize, retCas *uint32) uint32 {
	return statusUnimplemented
}

func proxySetSharedData(keyData *byte, keySize uint32, valueData *byte, valueSize uint32, cas uint32) uint32 {
	return statusUnimplemented
}

func proxySetProperty(pathData *byte, pathSize uint32, valueData *byte, valueSize uint32) uint32 {
	return statusUnimplemented
}

func proxyGetProperty(pathData *byte, pathSize uint32, retData, retSize *uint32) uint32 {
	return statusUnimplemented
}

func proxySetTickPeriodMilliseconds(period uint32) uint32 { return statusUnimplemented }

func proxyHTTPCall(upstreamData *byte, upstreamSize uint32, headersData *byte, headersSize uint32,
	bodyData *byte, bodySize uint32, trailersData *byte, trailersSize uint32, timeoutMs uint32, retCallID *uint32) uint32 {
	return statusUnimplemented
}

func proxyContinueStream(streamType uint32) uint32 { return statusUnimplemented }

func proxySetEffectiveContext(contextID uint32) uint32 { return statusUnimplemented }

func proxyDefineMetric(metricType uint32, nameData *byte, nameSize uint32, retID *uint32) uint32 {
	return statusUnimplemented
}

func proxyIncrementMetric(metricID uint32, delta int64) uint32 { return statusUnimplemented }

func proxyRecordMetric(metricID uint32, value uint64) uint32 { return statusUnimplemented }

func proxyGetMetric(metricID uint32, retValue *uint64) uint32 { return statusUnimplemented }

// NowUnixMicro reads the wall clock (natively: the time package's).
func NowUnixMicro() int64 { return time.Now().UnixMicro() }
