// Command tollgate-ratelimit is Tollgate's sync service: gateways send it the permits
// they consumed, it applies them to Redis (standalone, Cluster or Sentinel) and answers
// with the global state and each gateway's lease; operators manage rules through its
// admin API. Every flag can also be set through the TOLLGATE_* environment variable
// named in --help; a flag on the command line wins over the environment.
//
// It is secure by default: it refuses to start without a sync secret unless --insecure
// is given, gateways and operators reach it on separate listeners (--listen,
// --admin-listen), and secrets can come from files (--sync-secret-file,
// --admin-token-file, --redis-password-file) that are read again on SIGHUP.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/tollgate-rl/tollgate/ratelimit/rlqs"
	"github.com/tollgate-rl/tollgate/ratelimit/rls"
	"github.com/tollgate-rl/tollgate/ratelimit/rulestore/postgres"
	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/ratelimit/top"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	os.Exit(runWith(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, nil, hup))
}

// reloadSecrets reads every secret file again. A file that is missing, unreadable or
// empty keeps the previous value in use (an empty secret would lock every gateway out
// or open the API): logged and counted. Logs name the secret and file, never a value.
func reloadSecrets(sec *secrets, svc *service.Service, m *service.Metrics, log *slog.Logger) {
	for _, s := range sec.all() {
		changed, err := s.reload()
		if s.file == "" {
			continue
		}
		if err != nil {
			m.SecretReload(s.name, false)
			log.Error("secret reload failed: the previous value stays in use", "secret", s.name, "err", err)
			continue
		}
		m.SecretReload(s.name, true)
		log.Info("secret reloaded", "secret", s.name, "file", s.file, "changed", changed)
		switch s {
		case sec.sync:
			svc.SetSyncSecrets(s.values()...)
		case sec.admin:
			svc.SetAdminTokens(s.values()...)
		}
	}
}

// config is everything the flags set.
type config struct {
	listen            string
	adminListen       string
	rlsListen         string
	rlsLeases         bool
	rlsInterval       time.Duration
	rlqs              bool
	insecure          bool
	redisPassFile     string
	adminTokenFile    string
	syncSecretFile    string
	keyHashSecretFile string
	cmdlineSecrets    []string // secret flags given as values on the command line (visible in ps)
	redisMode         string
	redisAddrs        string
	redisMaster       string
	redisUser         string
	redisPassword     string
	redisTLS          bool
	redisCAFile       string
	redisCertFile     string
	redisKeyFile      string
	redisServerName   string
	redisAddrSlice    []string // --redis-addrs without schemes (parseConfig)
	poolSize          int
	dialTimeout       time.Duration
	readTimeout       time.Duration
	writeTimeout      time.Duration
	maxRetries        int
	batchTimeout      time.Duration
	adminToken        string
	syncSecret        string
	logLevel          string
	policyStore       string
	logFormat         string
	leaseEpoch        time.Duration
	leaseMaxShare     int64
	leaseRenew        time.Duration
	leaseHorizon      time.Duration
	penaltyBase       time.Duration
	penaltyMax        time.Duration
	fleetWindow       time.Duration
	fleetProbation    time.Duration
	fleetJoinRate     int
	fleetMaxNodes     int
	httpReadTimeout   time.Duration
	httpIdleTimeout   time.Duration
	shutdownTimeout   time.Duration
	topRawKeys        bool
	topMinutes        int
	topFlush          time.Duration
	syncIdentity      string
	nodeTokensOnly    bool
	meshProxies       string
	meshProxySlice    []netip.Prefix
}

// envName is the environment variable of a flag: TOLLGATE_ + upper snake case.
func envName(flagName string) string {
	return "TOLLGATE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func parseConfig(args []string, getenv func(string) string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("tollgate-ratelimit", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.listen, "listen", ":8081", "listen address of the gateways' API (/v1/sync, /v1/check, /v1/sync/rules) and /healthz, /readyz, /metrics")
	fs.StringVar(&c.adminListen, "admin-listen", defaultAdminListen, "listen address of the admin API (/v1/rules, /v1/lists, /v1/usage, /v1/reset, /v1/top) and /healthz, /readyz, /metrics; \""+sharedListener+"\": on the --listen listener")
	fs.StringVar(&c.rlsListen, "rls-listen", "", "listen address of Envoy's rate limit service API (gRPC envoy.service.ratelimit.v3.RateLimitService, for Envoy's native ratelimit filter), authenticated like /v1/sync; empty: off")
	fs.BoolVar(&c.rlsLeases, "rls-leases", true, "the rate limit service decides from leases held in memory, as a gateway does, synced to Redis every --rls-sync-interval (false: every descriptor is a strict check in Redis)")
	fs.DurationVar(&c.rlsInterval, "rls-sync-interval", 100*time.Millisecond, "sync interval of the rate limit service's leases")
	fs.BoolVar(&c.rlqs, "rlqs", true, "serve Envoy's rate limit quota service (gRPC envoy.service.rate_limit_quota.v3, for Envoy's rate_limit_quota filter) on --rls-listen beside the rate limit service")
	fs.BoolVar(&c.insecure, "insecure", false, "start without a sync secret: /v1/sync, /v1/check and /v1/sync/rules then accept any caller (logged at every start, gauge tollgate_insecure)")
	fs.StringVar(&c.redisMode, "redis-mode", "standalone", "Redis deployment: standalone, cluster or sentinel")
	fs.StringVar(&c.redisAddrs, "redis-addrs", "127.0.0.1:6379", "comma-separated Redis addresses host:port, or rediss://host:port for TLS (server; cluster seed nodes; sentinels)")
	fs.StringVar(&c.redisMaster, "redis-master", "", "Sentinel master name (sentinel mode)")
	fs.StringVar(&c.redisUser, "redis-username", "", "Redis ACL user name")
	fs.StringVar(&c.redisPassword, "redis-password", "", "Redis password (visible in the process list: prefer --redis-password-file)")
	fs.StringVar(&c.redisPassFile, "redis-password-file", "", "file holding the Redis password, read again on SIGHUP")
	fs.BoolVar(&c.redisTLS, "redis-tls", false, "connect to Redis (every node, Sentinels too) with TLS; rediss:// addresses imply it")
	fs.StringVar(&c.redisCAFile, "redis-tls-ca-file", "", "PEM file of the CA(s) that sign Redis's certificates (empty: the system's roots)")
	fs.StringVar(&c.redisCertFile, "redis-tls-cert-file", "", "PEM client certificate for Redis (tls-auth-clients), read at every new connection")
	fs.StringVar(&c.redisKeyFile, "redis-tls-key-file", "", "PEM private key of --redis-tls-cert-file")
	fs.StringVar(&c.redisServerName, "redis-tls-server-name", "", "name Redis's certificate must carry (empty: each address's host)")
	fs.BoolVar(&c.topRawKeys, "top-raw-keys", false, "store and answer raw caller keys in /v1/top instead of their hashes (caller keys are personal data and often credentials)")
	fs.IntVar(&c.topMinutes, "top-minutes", 5, "minutes a /v1/top list looks back")
	fs.DurationVar(&c.topFlush, "top-flush", 5*time.Second, "how often each instance adds its hot-key counts to Redis (the delay before /v1/top shows them)")
	fs.IntVar(&c.poolSize, "redis-pool-size", store.DefaultPoolSize, "Redis connections per node")
	fs.DurationVar(&c.dialTimeout, "redis-dial-timeout", store.DefaultDialTimeout, "Redis connect timeout")
	fs.DurationVar(&c.readTimeout, "redis-read-timeout", store.DefaultReadTimeout, "Redis read timeout (one pipeline's replies)")
	fs.DurationVar(&c.writeTimeout, "redis-write-timeout", store.DefaultWriteTimeout, "Redis write timeout")
	fs.IntVar(&c.maxRetries, "redis-max-retries", store.DefaultMaxRetries, "retries of a failed Redis round trip (small: gateways retry whole batches, idempotently)")
	fs.DurationVar(&c.batchTimeout, "batch-timeout", 0, "deadline for applying one batch (0: (retries+1) x (dial+read+write timeouts))")
	fs.StringVar(&c.adminToken, "admin-token", "", "bearer token of the admin API (/v1/rules, /v1/lists, /v1/usage, /v1/reset); empty disables it (visible in the process list: prefer --admin-token-file)")
	fs.StringVar(&c.adminTokenFile, "admin-token-file", "", "file holding the admin token(s), one per line, read again on SIGHUP")
	fs.StringVar(&c.syncSecret, "sync-secret", "", "bearer secret gateways send to /v1/sync, /v1/check, /v1/sync/rules; required unless --insecure (visible in the process list: prefer --sync-secret-file)")
	fs.StringVar(&c.keyHashSecretFile, "key-hash-secret-file", "", "file holding the secret caller keys are hashed with in Redis and logs (HMAC-SHA256; which keys: the rule set's key_hashing, default IP keys); without it keys are stored raw. Not reread on SIGHUP: a new secret starts every hashed bucket afresh")
	fs.StringVar(&c.syncIdentity, "sync-identity", "token", "how gateways are named: token (each sends its node token, `tollgate node-token`, derived from the master secrets of --sync-secret-file, and may sync only as that node) or mesh (the mTLS peer's SPIFFE id in x-forwarded-client-cert, from --mesh-trusted-proxies, scopes the node ids it sends; node tokens are accepted too when a sync secret is set)")
	fs.BoolVar(&c.nodeTokensOnly, "sync-node-tokens-only", false, "refuse the master secret itself as a gateway's credential (without it, a gateway sending the master secret, as the previous release's gateways do, may sync as any node: for upgrades only)")
	fs.StringVar(&c.meshProxies, "mesh-trusted-proxies", "127.0.0.0/8,::1/128", "comma-separated CIDRs of the proxy (the service's sidecar) whose x-forwarded-client-cert is believed, with --sync-identity mesh")
	fs.StringVar(&c.syncSecretFile, "sync-secret-file", "", "file holding the sync secret(s), one per line (several while a rotation overlaps), read again on SIGHUP")
	fs.StringVar(&c.policyStore, "policy-store", "", "PostgreSQL URL (postgres://user@host/db; the password in PGPASSFILE or PGPASSWORD) of the durable policy store: every rules version is kept there with author, time and reason, changes are refused (503) while it is down, and Redis is given the active version back after it lost it; empty: Redis alone")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.logFormat, "log-format", "json", "log format: json or text")
	d := lease.DefaultSyncConfig
	fs.DurationVar(&c.leaseEpoch, "lease-epoch", time.Duration(d.EpochMs)*time.Millisecond, "lease epoch: a lease granted or renewed in one epoch is reclaimed when the next-but-one begins (what a gateway that stopped syncing strands, at most two epochs), whole ms")
	fs.DurationVar(&c.leaseHorizon, "lease-horizon", time.Duration(d.HorizonMs)*time.Millisecond, "leases cover this much of a gateway's demand (the longer, the rarer the reports of a bucket within its lease), whole ms")
	fs.Int64Var(&c.leaseMaxShare, "lease-max-share", d.MaxShare, "one lease is at most 1/N of a bucket's capacity")
	fs.DurationVar(&c.leaseRenew, "lease-renew", time.Duration(d.RenewMs)*time.Millisecond, "gateways report when their lease falls to what their demand consumes in this long, whole ms")
	fs.DurationVar(&c.penaltyBase, "penalty-base", time.Duration(lease.DefaultSyncConfig.PenaltyBaseUs)*time.Microsecond, "first progressive-penalty cooldown (doubles per repeat)")
	fs.DurationVar(&c.penaltyMax, "penalty-max", time.Duration(lease.DefaultSyncConfig.PenaltyMaxUs)*time.Microsecond, "longest progressive-penalty cooldown")
	fs.DurationVar(&c.fleetWindow, "fleet-window", store.DefaultFleetWindow, "gateways that synced within this window count in the fleet size")
	fs.DurationVar(&c.fleetProbation, "fleet-probation", store.DefaultProbation, "a gateway counts in the fleet size once it has synced for this long (node ids sent once never count)")
	fs.IntVar(&c.fleetJoinRate, "fleet-join-rate", store.DefaultJoinRate, "gateways that may join the fleet per second, over all instances (invented node ids raise the fleet size at most this fast)")
	fs.IntVar(&c.fleetMaxNodes, "fleet-max-nodes", store.DefaultMaxNodes, "the fleet size never counts more gateways than this")
	fs.DurationVar(&c.httpReadTimeout, "http-read-timeout", 10*time.Second, "HTTP request read timeout (headers and body)")
	fs.DurationVar(&c.httpIdleTimeout, "http-idle-timeout", 120*time.Second, "HTTP keep-alive idle timeout")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests may take to finish")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: tollgate-ratelimit [flags]\n\n"+
			"Tollgate's sync service. Gateways POST consumed permits to /v1/sync (binary wire\n"+
			"format) and get the global state and their leases back; /v1/check answers strict\n"+
			"rules synchronously; operators use /v1/rules, /v1/lists/{allow,deny},\n"+
			"/v1/usage/{key} and /v1/reset/{key}. Health: /healthz, /readyz; metrics: /metrics.\n\n"+
			"Flags (each also read from the environment variable in brackets):\n")
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(out, "  --%s [%s]\n    \t%s (default %q)\n", f.Name, envName(f.Name), f.Usage, f.DefValue)
		})
	}
	// Environment first, so explicit flags override it.
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(envName(f.Name)); v != "" && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return c, envErr
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "sync-secret", "admin-token", "redis-password":
			if f.Value.String() != "" {
				c.cmdlineSecrets = append(c.cmdlineSecrets, "--"+f.Name)
			}
		case "policy-store":
			// A password in the URL's user part, in its query (?password=) or in a
			// key=value DSN: pgx takes all three.
			v := f.Value.String()
			inUser := false
			if u, err := url.Parse(v); err == nil && u.User != nil {
				_, inUser = u.User.Password()
			}
			if inUser || strings.Contains(strings.ToLower(v), "password=") {
				c.cmdlineSecrets = append(c.cmdlineSecrets, "--"+f.Name+" (its password)")
			}
		}
	})
	var err error
	if c.redisAddrSlice, err = c.redisAddrList(); err != nil {
		return c, err
	}
	if c.syncIdentity != "token" && c.syncIdentity != "mesh" {
		return c, fmt.Errorf("--sync-identity %q: want token or mesh", c.syncIdentity)
	}
	for _, p := range strings.Split(c.meshProxies, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return c, fmt.Errorf("--mesh-trusted-proxies %q: %w", p, err)
		}
		c.meshProxySlice = append(c.meshProxySlice, pfx.Masked())
	}
	switch {
	case c.leaseHorizon < time.Millisecond || c.leaseHorizon > time.Duration(lease.MaxHorizonMs)*time.Millisecond:
		return c, fmt.Errorf("--lease-horizon %v: want 1ms..%dms", c.leaseHorizon, lease.MaxHorizonMs)
	case c.leaseEpoch < time.Second || c.leaseEpoch > time.Hour:
		return c, fmt.Errorf("--lease-epoch %v: want 1s..1h", c.leaseEpoch)
	case c.leaseMaxShare < 1:
		return c, fmt.Errorf("--lease-max-share %d: want at least 1", c.leaseMaxShare)
	case c.leaseRenew < time.Millisecond || c.leaseRenew > time.Duration(lease.MaxHorizonMs)*time.Millisecond:
		return c, fmt.Errorf("--lease-renew %v: want 1ms..%dms", c.leaseRenew, lease.MaxHorizonMs)
	case c.penaltyBase <= 0 || c.penaltyMax < c.penaltyBase:
		return c, fmt.Errorf("--penalty-base %v / --penalty-max %v: want 0 < base <= max", c.penaltyBase, c.penaltyMax)
	case c.fleetProbation < 0 || c.fleetJoinRate < 1 || c.fleetMaxNodes < 1:
		return c, fmt.Errorf("--fleet-probation %v, --fleet-join-rate %d, --fleet-max-nodes %d: want >= 0, >= 1, >= 1", c.fleetProbation, c.fleetJoinRate, c.fleetMaxNodes)
	case c.adminListen == "":
		return c, fmt.Errorf("--admin-listen: empty (an address, or %q)", sharedListener)
	case c.topMinutes < 1 || c.topMinutes > 60 || c.topFlush < 100*time.Millisecond || c.topFlush > time.Minute:
		return c, fmt.Errorf("--top-minutes %d, --top-flush %v: want 1..60 and 100ms..1m", c.topMinutes, c.topFlush)
	}
	return c, nil
}

// defaultAdminListen keeps the admin API on loopback unless asked otherwise: a
// deployment that opens it to the network says so.
const defaultAdminListen = "127.0.0.1:8082"

// sharedListener as --admin-listen serves the admin API on the --listen listener.
const sharedListener = "shared"

// secrets are the service's credentials, from values or files.
type secrets struct {
	sync, admin, redis *secret
}

func (c config) secrets() *secrets {
	return &secrets{
		sync:  &secret{name: "sync", flag: "sync-secret", value: c.syncSecret, file: c.syncSecretFile, multi: true},
		admin: &secret{name: "admin", flag: "admin-token", value: c.adminToken, file: c.adminTokenFile, multi: true},
		redis: &secret{name: "redis", flag: "redis-password", value: c.redisPassword, file: c.redisPassFile},
	}
}

func (s *secrets) all() []*secret { return []*secret{s.sync, s.admin, s.redis} }

func (c config) storeConfig() store.Config {
	addrs := c.redisAddrSlice
	retries := c.maxRetries
	if retries == 0 {
		retries = -1 // store.Config: 0 is "default", negative is "none"
	}
	probation := c.fleetProbation
	if probation == 0 {
		probation = -1 // the same convention
	}
	return store.Config{
		Mode: store.Mode(c.redisMode), Addrs: addrs, MasterName: c.redisMaster,
		Username: c.redisUser, Password: c.redisPassword, PoolSize: c.poolSize,
		DialTimeout: c.dialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
		MaxRetries:  retries,
		FleetWindow: c.fleetWindow, FleetProbation: probation, FleetJoinRate: c.fleetJoinRate, FleetMaxNodes: c.fleetMaxNodes,
		Lease: lease.SyncConfig{
			EpochMs: c.leaseEpoch.Milliseconds(), HorizonMs: c.leaseHorizon.Milliseconds(),
			MaxShare: c.leaseMaxShare, RenewMs: c.leaseRenew.Milliseconds(),
			MinElapsedMs: lease.DefaultSyncConfig.MinElapsedMs, ValidMarginMs: lease.DefaultSyncConfig.ValidMarginMs,
			PenaltyBaseUs: c.penaltyBase.Microseconds(), PenaltyMaxUs: c.penaltyMax.Microseconds(),
		},
	}
}

func newLogger(c config, w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", c.logLevel, err)
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch c.logFormat {
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want json or text", c.logFormat)
	}
}

// listening is where the service listens (run sends it on ready).
type listening struct {
	sync, admin string
	rls         string // "" when --rls-listen is off
}

// run is main without the process: it serves until ctx ends, then drains. ready, if
// not nil, receives the listening addresses. Each value on reload (SIGHUP in main) reads
// the secret files again.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, ready chan<- listening) int {
	return runWith(ctx, args, getenv, stdout, stderr, ready, nil)
}

func runWith(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, ready chan<- listening, reload <-chan os.Signal) int {
	if len(args) > 0 && args[0] == "rules" {
		return runRules(args[1:], os.Stdin, stdout, stderr)
	}
	c, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "tollgate-ratelimit:", err)
		return 2
	}
	log, err := newLogger(c, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "tollgate-ratelimit:", err)
		return 2
	}
	store.RouteRedisLogs(log)
	sec := c.secrets()
	for _, s := range sec.all() {
		if err := s.load(); err != nil {
			fmt.Fprintln(stderr, "tollgate-ratelimit:", err)
			return 2
		}
	}
	if len(sec.sync.values()) == 0 && !c.insecure && c.syncIdentity != "mesh" {
		fmt.Fprintln(stderr, "tollgate-ratelimit: no sync secret: give --sync-secret-file (or --sync-secret), "+
			"--sync-identity mesh behind an mTLS sidecar, or --insecure to let any caller sync (only behind mTLS and a network policy)")
		return 2
	}
	if len(sec.sync.values()) > 0 && !c.nodeTokensOnly {
		log.Warn("the master sync secret is accepted as a gateway credential for any node (upgrade mode): give gateways node tokens (tollgate node-token) and set --sync-node-tokens-only",
			"metric", `tollgate_sync_auth_total{mode="shared_secret"}`)
	}
	if c.insecure {
		// Loud at every start: an insecure service must never pass unnoticed.
		log.Error("INSECURE MODE (--insecure): any caller that reaches --listen can report consumption and read rules",
			"sync_secret_set", len(sec.sync.values()) > 0)
	}
	for _, f := range c.cmdlineSecrets {
		log.Warn("secret given on the command line: every local user can read it in the process list; use the -file form", "flag", f)
	}
	m := service.NewMetrics()
	sc := c.storeConfig()
	if c.redisPassFile != "" {
		user := c.redisUser
		sc.Credentials = func() (string, string) { return user, sec.redis.first() }
	}
	if sc.TLS, err = c.redisTLSConfig(); err != nil {
		fmt.Fprintln(stderr, "tollgate-ratelimit:", err)
		return 2
	}
	st, err := store.Open(sc, m)
	if err != nil {
		log.Error("redis", "err", err)
		return 1
	}
	defer st.Close()
	if fatal, transient := checkRedis(ctx, st, c); fatal != nil {
		fmt.Fprintln(stderr, "tollgate-ratelimit:", fatal)
		return 1
	} else if transient != nil {
		log.Warn("Redis does not answer yet: /readyz fails until it does", "addrs", c.redisAddrs, "err", transient)
	}
	var keyHashSecret []byte
	if c.keyHashSecretFile != "" {
		vals, err := readSecretFile(c.keyHashSecretFile, false)
		if err != nil {
			fmt.Fprintln(stderr, "tollgate-ratelimit: --key-hash-secret-file:", err)
			return 1
		}
		keyHashSecret = []byte(vals[0])
	} else {
		log.Warn("no --key-hash-secret-file: caller keys (client IPs, API keys) are stored raw in Redis")
	}
	scfg := service.Config{SyncSecret: sec.sync.first(), Insecure: c.insecure, AdminToken: sec.admin.first(),
		NodeTokensOnly: c.nodeTokensOnly, Mesh: service.MeshIdentity{Enabled: c.syncIdentity == "mesh", TrustedProxies: c.meshProxySlice},
		BatchTimeout: c.batchTimeout, Logger: log, KeyHashSecret: keyHashSecret,
		Top: top.Config{RawKeys: c.topRawKeys, Minutes: c.topMinutes, Flush: c.topFlush}}
	if c.policyStore != "" {
		pol, err := postgres.Open(ctx, c.policyStore)
		if err != nil {
			fmt.Fprintln(stderr, "tollgate-ratelimit: --policy-store:", err)
			return 2
		}
		defer pol.Close()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := pol.Ping(pctx); err != nil {
			log.Warn("policy store does not answer yet: rules are served from Redis, changes are refused until it does", "err", err)
		}
		cancel()
		scfg.Policy = pol
	}
	svc := service.New(scfg, st, m)
	svc.SetSyncSecrets(sec.sync.values()...)
	svc.SetAdminTokens(sec.admin.values()...)
	if len(sec.admin.values()) == 0 {
		log.Warn("no admin token configured: the admin API answers 401")
	}

	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: c.httpReadTimeout,
			ReadTimeout:       c.httpReadTimeout,
			// A batch may take up to its deadline; the answer then has to get out.
			WriteTimeout:   svc.BatchTimeout() + c.httpReadTimeout,
			IdleTimeout:    c.httpIdleTimeout,
			MaxHeaderBytes: 64 << 10,
			ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
	}
	type server struct {
		srv *http.Server
		ln  net.Listener
	}
	var servers []server
	defer func() {
		for _, s := range servers {
			_ = s.ln.Close()
		}
	}()
	listen := func(addr string, h http.Handler) (net.Listener, bool) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			log.Error("listen", "addr", addr, "err", err)
			return nil, false
		}
		servers = append(servers, server{newServer(h), ln})
		return ln, true
	}
	var where listening
	if c.adminListen == sharedListener {
		ln, ok := listen(c.listen, svc.Handler())
		if !ok {
			return 1
		}
		where = listening{sync: ln.Addr().String(), admin: ln.Addr().String()}
	} else {
		sl, ok := listen(c.listen, svc.SyncHandler())
		if !ok {
			return 1
		}
		al, ok := listen(c.adminListen, svc.AdminHandler())
		if !ok {
			return 1
		}
		where = listening{sync: sl.Addr().String(), admin: al.Addr().String()}
	}
	var grpcSrv *grpc.Server
	var rlsSrv *rls.Server
	var rlqsSrv *rlqs.Server
	if c.rlsListen != "" {
		ln, err := net.Listen("tcp", c.rlsListen)
		if err != nil {
			log.Error("listen", "addr", c.rlsListen, "err", err)
			return 1
		}
		defer ln.Close()
		rlsSrv = rls.New(svc, log, rls.LeaseOptions{Off: !c.rlsLeases, Interval: c.rlsInterval})
		grpcSrv = rlsSrv.GRPCServer()
		if c.rlqs {
			// Same listener, same authentication (the RLS server's interceptors).
			rlqsSrv = rlqs.New(svc, log, rlqs.Options{})
			rlqsSrv.Register(grpcSrv)
		}
		where.rls = ln.Addr().String()
		go func() {
			if err := grpcSrv.Serve(ln); err != nil {
				log.Error("rls serve", "err", err)
			}
		}()
	}
	bg, cancelBG := context.WithCancel(context.Background())
	bgDone := make(chan struct{})
	go func() { defer close(bgDone); svc.Run(bg) }()
	serveErr := make(chan error, len(servers))
	for _, s := range servers {
		go func() { serveErr <- s.srv.Serve(s.ln) }()
	}
	log.Info("serving", "addr", where.sync, "admin_addr", where.admin, "rls_addr", where.rls, "insecure", c.insecure,
		"redis_mode", c.redisMode, "redis_addrs", c.redisAddrs, "redis_tls", c.redisTLS,
		"batch_timeout", svc.BatchTimeout(), "lease_epoch", c.leaseEpoch, "lease_horizon", c.leaseHorizon)
	if ready != nil {
		ready <- where
	}

	code := 0
wait:
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down: draining in-flight requests", "timeout", c.shutdownTimeout)
			break wait
		case err := <-serveErr:
			log.Error("serve", "err", err)
			code = 1
			break wait
		case <-reload:
			reloadSecrets(sec, svc, m, log)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	for _, s := range servers {
		if err := s.srv.Shutdown(sctx); err != nil {
			log.Warn("shutdown incomplete", "err", err)
			code = 1
		}
	}
	if grpcSrv != nil {
		if rlqsSrv != nil {
			// TTL-0 assignments first: Envoys fall back now, then their streams end.
			rlqsSrv.Close()
		}
		stopGRPC(sctx, grpcSrv)
		rlsSrv.Close() // a last report gives the replica's leases back
	}
	cancelBG()
	<-bgDone
	log.Info("stopped")
	return code
}

// stopGRPC lets in-flight calls finish until ctx ends, then closes what is left.
func stopGRPC(ctx context.Context, g *grpc.Server) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		g.Stop()
		<-done
	}
}
