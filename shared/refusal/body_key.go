package refusal

import "strconv"

// CodeUnauthenticated is the code of a 401 refusal: a rule requires a caller key the
// request does not carry. (A 403 for the same reason uses CodeForbidden.)
const CodeUnauthenticated = "UNAUTHENTICATED"

// AppendBodyKeyMissing appends the body of a refusal by a rule whose missing-key policy
// is "deny" (status 401 or 403):
//
//	{"error":{"code":"UNAUTHENTICATED","message":"Request carries no caller key","details":{"status":401,"rule":"api"}}}
//
// It names the rule, never a key (there is none).
func AppendBodyKeyMissing(dst []byte, status int, rule string) []byte {
	code := CodeUnauthenticated
	if status == 403 {
		code = CodeForbidden
	}
	dst = append(dst, `{"error":{"code":"`...)
	dst = append(dst, code...)
	dst = append(dst, `","message":"Request carries no caller key","details":{"status":`...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, `,"rule":`...)
	dst = appendJSONString(dst, rule)
	return append(dst, "}}}"...)
}
