package redistest

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestTLSAndACL starts a standalone server, a Sentinel monitoring it, and a cluster, all
// TLS-only with an ACL user: the user with the CA's trust gets in; a plain connection,
// the default user and a wrong password do not. The cluster's replicas and the Sentinel
// reach their primary only if replication and monitoring authenticate over TLS too.
func TestTLSAndACL(t *testing.T) {
	files, err := GenerateTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o := Options{TLS: files, User: "tg", Password: "tg-pass"}
	good, err := files.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := StartStandaloneWith(t, o)

	tests := []struct {
		name      string
		tls       *tls.Config
		user, pw  string
		fail      bool
		wantErrIn string // what the error must say, if anything
	}{
		{"acl user over tls", good, "tg", "tg-pass", false, ""},
		{"wrong password", good, "tg", "nope", true, "WRONGPASS"},
		{"default user", good, "", "", true, "NOAUTH"},
		{"plain connection", nil, "tg", "tg-pass", true, ""}, // EOF or reset, as the server closes
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), TLSConfig: tc.tls, Username: tc.user, Password: tc.pw,
				MaxRetries: -1, Protocol: 2, DisableIdentity: true, DialTimeout: time.Second, ReadTimeout: time.Second})
			defer c.Close()
			err := c.Set(ctx, "k", "v", 0).Err()
			switch {
			case !tc.fail && err != nil:
				t.Fatalf("SET: %v", err)
			case tc.fail && (err == nil || !strings.Contains(err.Error(), tc.wantErrIn)):
				t.Fatalf("SET: %v, want an error containing %q", err, tc.wantErrIn)
			}
		})
	}

	t.Run("sentinel", func(t *testing.T) {
		sen, err := LaunchSentinel(srv.Addr(), "tgm", o)
		if err != nil {
			t.Fatal(err)
		}
		defer sen.Stop()
		fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "tgm", SentinelAddrs: sen.Addrs(), TLSConfig: good,
			Username: "tg", Password: "tg-pass", MaxRetries: -1, Protocol: 2, DisableIdentity: true})
		defer fc.Close()
		if got, err := fc.Get(ctx, "k").Result(); err != nil || got != "v" {
			t.Fatalf("GET through the Sentinel: %q, %v", got, err)
		}
		// The Sentinel's view of the primary comes from its own authenticated TLS link.
		sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr(), TLSConfig: good, Protocol: 2, DisableIdentity: true})
		defer sc.Close()
		m, err := sc.Master(ctx, "tgm").Result()
		if err != nil || strings.Contains(m["flags"], "down") {
			t.Fatalf("sentinel master: %v, %v", m, err)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		c := StartClusterWith(t, o)
		cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), TLSConfig: good, Username: "tg", Password: "tg-pass", Protocol: 2, DisableIdentity: true})
		defer cl.Close()
		for _, k := range []string{"a", "b", "c"} {
			if err := cl.Set(ctx, k, "v", 0).Err(); err != nil {
				t.Fatalf("set %q: %v", k, err)
			}
		}
		// Replicas are in sync with their primaries (replication over TLS, as the user).
		err := cl.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			info, err := n.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
				return &linkDown{info}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

type linkDown struct{ info string }

func (l *linkDown) Error() string { return "replica link down: " + l.info }
