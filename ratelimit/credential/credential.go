// Package credential is a gateway's sync credential outside a mesh: a node token that
// names one node and is valid only for it, so issuing one sidecar's token gives no power
// over another's node (its batch sequence and idempotency records, ratelimit/README.md
// "Gateway identity").
//
// A token is Prefix, the node id, a dot, and HMAC-SHA256(master secret, Context + node
// id) in base64url. The master secrets are the lines of the service's --sync-secret-file;
// the service derives every node's token itself, so it stores nothing per gateway, and
// rotation is what it was with a shared secret: add a new master, issue new tokens, move
// the gateways, remove the old master.
package credential

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Prefix starts every node token (its format version).
const Prefix = "tgn1."

// Context separates node-token MACs from any other use of the master secret.
const Context = "tollgate node token v1\x00"

// ValidNode reports why node cannot be named by a credential ("" when it can): it must
// fit a batch (wire.MaxStringLen) and travel in a header (visible ASCII, no space).
func ValidNode(node string) string {
	if node == "" || len(node) > wire.MaxStringLen {
		return fmt.Sprintf("node id: want 1..%d bytes, got %d", wire.MaxStringLen, len(node))
	}
	for i := 0; i < len(node); i++ {
		if c := node[i]; c <= ' ' || c > '~' {
			return fmt.Sprintf("node id %q: byte %d is not visible ASCII", node, i)
		}
	}
	return ""
}

// Issue is node's token under master.
func Issue(master []byte, node string) (string, error) {
	if why := ValidNode(node); why != "" {
		return "", errors.New(why)
	}
	if len(master) == 0 {
		return "", errors.New("master secret: empty")
	}
	return Prefix + node + "." + base64.RawURLEncoding.EncodeToString(sum(master, node)), nil
}

func sum(master []byte, node string) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(Context))
	m.Write([]byte(node))
	return m.Sum(nil)
}

// Verify returns the node tok names when one of masters issued it.
func Verify(tok string, masters []string) (string, bool) {
	rest, ok := strings.CutPrefix(tok, Prefix)
	if !ok {
		return "", false
	}
	dot := strings.LastIndexByte(rest, '.')
	if dot <= 0 {
		return "", false
	}
	node := rest[:dot]
	got, err := base64.RawURLEncoding.Strict().DecodeString(rest[dot+1:])
	if err != nil || len(got) != sha256.Size || ValidNode(node) != "" {
		return "", false
	}
	match := 0
	for _, m := range masters {
		match |= subtle.ConstantTimeCompare(got, sum([]byte(m), node))
	}
	return node, match == 1
}
