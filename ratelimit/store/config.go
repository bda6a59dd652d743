package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tollgate-rl/tollgate/internal/backend"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

// Mode is how the service reaches Redis.
type Mode string

const (
	Standalone Mode = "standalone"
	Cluster    Mode = "cluster"
	Sentinel   Mode = "sentinel"
)

// Config configures the Redis connection and the lease protocol.
type Config struct {
	Mode Mode
	// Addrs: the server (standalone), seed nodes (cluster) or sentinels (sentinel).
	Addrs      []string
	MasterName string // sentinel only
	Username   string
	Password   string
	// Credentials, when set, is asked for the user name and password at every new
	// connection instead of Username and Password: a password read from a file can
	// change (SIGHUP) without a restart.
	Credentials func() (username, password string)
	// TLS, when set, makes every connection (to the server, each cluster node, the
	// Sentinels and the primary they name) use TLS with this configuration. An empty
	// ServerName is taken from each address dialled.
	TLS *tls.Config
	// PoolSize is connections per node (default 10 × GOMAXPROCS, go-redis's default,
	// is too small for many concurrent batches: default here 64).
	PoolSize int
	// Timeouts of one network operation. A dead primary costs at most
	// DialTimeout (or Read/WriteTimeout) per attempt, MaxRetries+1 attempts.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// MaxRetries is the number of retries of a failed command (default 1; negative: none).
	// Small on purpose: the gateway retries the whole batch, idempotently.
	MaxRetries int
	// Lease is the service-side lease protocol configuration.
	Lease lease.SyncConfig
	// FleetWindow is how recently a gateway must have synced to count in Reply.Nodes
	// (default 5 s).
	FleetWindow time.Duration
	// FleetProbation is how long a gateway must sync before it counts in the fleet size
	// (default 1 s; negative: none): an id sent once, or for a moment, never counts.
	FleetProbation time.Duration
	// FleetJoinRate is how many gateways may join the fleet per second, over all
	// instances (default 50): invented ids raise the fleet size at most this fast.
	FleetJoinRate int
	// FleetMaxNodes caps the fleet size (default 10,000).
	FleetMaxNodes int
	// IdempotencyTTL is how long a gateway's record of its last batch on a Redis node
	// lives after that batch (default 60 s): a batch resent later than this after it was
	// applied would be applied again.
	IdempotencyTTL time.Duration
}

// Defaults for Config.
const (
	DefaultPoolSize     = 64
	DefaultDialTimeout  = 500 * time.Millisecond
	DefaultReadTimeout  = 500 * time.Millisecond
	DefaultWriteTimeout = 500 * time.Millisecond
	DefaultMaxRetries   = 1
	DefaultFleetWindow  = backend.DefaultFleetWindow
	DefaultProbation    = backend.DefaultFleetProbation
	DefaultJoinRate     = backend.DefaultFleetJoinRate
	DefaultMaxNodes     = backend.DefaultFleetMaxNodes
	DefaultIdempotency  = backend.DefaultIdempotencyTTL
	// retryBackoff bounds go-redis's sleep between retries.
	retryBackoff = 50 * time.Millisecond
)

func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = Standalone
	}
	if c.PoolSize <= 0 {
		c.PoolSize = DefaultPoolSize
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.FleetWindow <= 0 {
		c.FleetWindow = DefaultFleetWindow
	}
	switch {
	case c.FleetProbation == 0:
		c.FleetProbation = DefaultProbation
	case c.FleetProbation < 0:
		c.FleetProbation = 0
	}
	if c.FleetJoinRate <= 0 {
		c.FleetJoinRate = DefaultJoinRate
	}
	if c.FleetMaxNodes <= 0 {
		c.FleetMaxNodes = DefaultMaxNodes
	}
	if c.IdempotencyTTL <= 0 {
		c.IdempotencyTTL = DefaultIdempotency
	}
	c.Lease = c.Lease.Normalized()
	return c
}

// AttemptBudget is the longest one Redis round trip may take before go-redis gives up
// on it (dial, write and read timeouts plus the retry backoff), for each of the
// MaxRetries+1 attempts. The service's per-batch deadline should be a small multiple.
func (c Config) AttemptBudget() time.Duration {
	c = c.withDefaults()
	return c.DialTimeout + c.WriteTimeout + c.ReadTimeout + retryBackoff
}

// ErrConfig is wrapped by configuration errors.
var ErrConfig = errors.New("store: invalid configuration")

// NewClient builds the go-redis client for the configured mode. Retries are few and
// timeouts short so a dead primary fails a batch fast; the gateway's idempotent retry
// does the rest once a replica is promoted.
func NewClient(cfg Config) (redis.UniversalClient, error) {
	c := cfg.withDefaults()
	if len(c.Addrs) == 0 {
		return nil, fmt.Errorf("%w: no Redis addresses", ErrConfig)
	}
	noMaint := &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	creds := c.Credentials
	switch c.Mode {
	case Standalone:
		if len(c.Addrs) != 1 {
			return nil, fmt.Errorf("%w: standalone mode takes one address, got %q", ErrConfig, c.Addrs)
		}
		return redis.NewClient(&redis.Options{
			Addr: c.Addrs[0], Username: c.Username, Password: c.Password, CredentialsProvider: creds,
			PoolSize: c.PoolSize, DialTimeout: c.DialTimeout, ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout,
			MaxRetries: c.MaxRetries, MinRetryBackoff: retryBackoff / 4, MaxRetryBackoff: retryBackoff,
			DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
			MaintNotificationsConfig: noMaint,
			TLSConfig:                c.TLS,
		}), nil
	case Cluster:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: c.Addrs, Username: c.Username, Password: c.Password, CredentialsProvider: creds,
			PoolSize: c.PoolSize, DialTimeout: c.DialTimeout, ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout,
			// In a cluster client retries are redirects (MOVED/ASK during a failover) and
			// network errors; two lets a batch follow one promotion.
			MaxRedirects: max(c.MaxRetries, 2), MinRetryBackoff: retryBackoff / 4, MaxRetryBackoff: retryBackoff,
			DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
			MaintNotificationsConfig: noMaint, ClusterStateReloadInterval: 5 * time.Second,
			TLSConfig: c.TLS,
		}), nil
	case Sentinel:
		if c.MasterName == "" {
			return nil, fmt.Errorf("%w: sentinel mode needs a master name", ErrConfig)
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.MasterName, SentinelAddrs: c.Addrs, Username: c.Username, Password: c.Password, CredentialsProvider: creds,
			PoolSize: c.PoolSize, DialTimeout: c.DialTimeout, ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout,
			MaxRetries: c.MaxRetries, MinRetryBackoff: retryBackoff / 4, MaxRetryBackoff: retryBackoff,
			DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
			TLSConfig: c.TLS,
		}), nil
	default:
		return nil, fmt.Errorf("%w: unknown mode %q (standalone, cluster, sentinel)", ErrConfig, c.Mode)
	}
}

// slogLogger adapts go-redis's process-wide logger to slog.
type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Printf(ctx context.Context, format string, v ...any) {
	s.l.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// RouteRedisLogs sends go-redis's own log lines (dial failures during a failover, pool
// events) to l at debug level instead of stderr. It is process-wide.
func RouteRedisLogs(l *slog.Logger) { redis.SetLogger(slogLogger{l}) }
