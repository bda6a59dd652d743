// Command tollgate-ratelimit is Tollgate's sync service: gateways send it the permits
// they consumed, it applies them to Redis (standalone, Cluster or Sentinel) and answers
// with the global state and each gateway's lease; operators manage rules through its
// admin API. Every flag can also be set through the TOLLGATE_* environment variable
// named in --help; a flag on the command line wins over the environment.
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
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/service"
	"github.com/tollgate-rl/tollgate/ratelimit/store"
	"github.com/tollgate-rl/tollgate/shared/lease"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, nil))
}

// config is everything the flags set.
type config struct {
	listen          string
	redisMode       string
	redisAddrs      string
	redisMaster     string
	redisUser       string
	redisPassword   string
	poolSize        int
	dialTimeout     time.Duration
	readTimeout     time.Duration
	writeTimeout    time.Duration
	maxRetries      int
	batchTimeout    time.Duration
	adminToken      string
	syncSecret      string
	logLevel        string
	logFormat       string
	leaseEpoch      time.Duration
	leaseMaxShare   int64
	leaseRenew      time.Duration
	leaseHorizon    time.Duration
	penaltyBase     time.Duration
	penaltyMax      time.Duration
	fleetWindow     time.Duration
	httpReadTimeout time.Duration
	httpIdleTimeout time.Duration
	shutdownTimeout time.Duration
}

// envName is the environment variable of a flag: TOLLGATE_ + upper snake case.
func envName(flagName string) string {
	return "TOLLGATE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func parseConfig(args []string, getenv func(string) string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("tollgate-ratelimit", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.listen, "listen", ":8081", "HTTP listen address")
	fs.StringVar(&c.redisMode, "redis-mode", "standalone", "Redis deployment: standalone, cluster or sentinel")
	fs.StringVar(&c.redisAddrs, "redis-addrs", "127.0.0.1:6379", "comma-separated Redis addresses (server; cluster seed nodes; sentinels)")
	fs.StringVar(&c.redisMaster, "redis-master", "", "Sentinel master name (sentinel mode)")
	fs.StringVar(&c.redisUser, "redis-username", "", "Redis ACL user name")
	fs.StringVar(&c.redisPassword, "redis-password", "", "Redis password")
	fs.IntVar(&c.poolSize, "redis-pool-size", store.DefaultPoolSize, "Redis connections per node")
	fs.DurationVar(&c.dialTimeout, "redis-dial-timeout", store.DefaultDialTimeout, "Redis connect timeout")
	fs.DurationVar(&c.readTimeout, "redis-read-timeout", store.DefaultReadTimeout, "Redis read timeout (one pipeline's replies)")
	fs.DurationVar(&c.writeTimeout, "redis-write-timeout", store.DefaultWriteTimeout, "Redis write timeout")
	fs.IntVar(&c.maxRetries, "redis-max-retries", store.DefaultMaxRetries, "retries of a failed Redis round trip (small: gateways retry whole batches, idempotently)")
	fs.DurationVar(&c.batchTimeout, "batch-timeout", 0, "deadline for applying one batch (0: (retries+1) x (dial+read+write timeouts))")
	fs.StringVar(&c.adminToken, "admin-token", "", "bearer token of the admin API (/v1/rules, /v1/lists, /v1/usage, /v1/reset); empty disables it")
	fs.StringVar(&c.syncSecret, "sync-secret", "", "bearer secret gateways send to /v1/sync, /v1/check, /v1/sync/rules; empty: no authentication")
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
	}
	return c, nil
}

func (c config) storeConfig() store.Config {
	var addrs []string
	for _, a := range strings.Split(c.redisAddrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	retries := c.maxRetries
	if retries == 0 {
		retries = -1 // store.Config: 0 is "default", negative is "none"
	}
	return store.Config{
		Mode: store.Mode(c.redisMode), Addrs: addrs, MasterName: c.redisMaster,
		Username: c.redisUser, Password: c.redisPassword, PoolSize: c.poolSize,
		DialTimeout: c.dialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
		MaxRetries:  retries,
		FleetWindow: c.fleetWindow,
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

// run is main without the process: it serves until ctx ends, then drains. ready, if
// not nil, receives the listening address.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, ready chan<- string) int {
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
	m := service.NewMetrics()
	st, err := store.Open(c.storeConfig(), m)
	if err != nil {
		log.Error("redis", "err", err)
		return 1
	}
	defer st.Close()
	svc := service.New(service.Config{SyncSecret: c.syncSecret, AdminToken: c.adminToken, BatchTimeout: c.batchTimeout, Logger: log}, st, m)
	if c.adminToken == "" {
		log.Warn("no admin token configured: the admin API answers 401")
	}

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		log.Error("listen", "addr", c.listen, "err", err)
		return 1
	}
	srv := &http.Server{
		Handler:           svc.Handler(),
		ReadHeaderTimeout: c.httpReadTimeout,
		ReadTimeout:       c.httpReadTimeout,
		// A batch may take up to its deadline; the answer then has to get out.
		WriteTimeout:   svc.BatchTimeout() + c.httpReadTimeout,
		IdleTimeout:    c.httpIdleTimeout,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	bg, cancelBG := context.WithCancel(context.Background())
	bgDone := make(chan struct{})
	go func() { defer close(bgDone); svc.Run(bg) }()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "redis_mode", c.redisMode, "redis_addrs", c.redisAddrs,
		"batch_timeout", svc.BatchTimeout(), "lease_epoch", c.leaseEpoch, "lease_horizon", c.leaseHorizon)
	if ready != nil {
		ready <- ln.Addr().String()
	}

	code := 0
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests", "timeout", c.shutdownTimeout)
	case err := <-serveErr:
		log.Error("serve", "err", err)
		code = 1
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown incomplete", "err", err)
		code = 1
	}
	cancelBG()
	<-bgDone
	log.Info("stopped")
	return code
}
