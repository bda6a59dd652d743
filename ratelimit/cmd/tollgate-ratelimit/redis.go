package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/ratelimit/store"
)

// redisAddrList splits --redis-addrs. An address may carry the scheme redis:// or
// rediss:// (TLS, as in Redis URLs); all must agree, and rediss:// turns --redis-tls on.
func (c *config) redisAddrList() ([]string, error) {
	var addrs []string
	scheme := ""
	for _, a := range strings.Split(c.redisAddrs, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		s := ""
		if i := strings.Index(a, "://"); i >= 0 {
			s, a = a[:i], a[i+3:]
			if s != "redis" && s != "rediss" {
				return nil, fmt.Errorf("--redis-addrs: scheme %q: want redis:// or rediss:// (or none)", s)
			}
			if strings.ContainsAny(a, "/@?") {
				// Not quoted: the part before @ may be a password.
				return nil, fmt.Errorf("--redis-addrs: a %s:// address with more than host:port: user, password and database are separate settings", s)
			}
		}
		if s != "" && scheme != "" && s != scheme {
			return nil, fmt.Errorf("--redis-addrs: both redis:// and rediss:// given: one connection mode for all")
		}
		if s != "" {
			scheme = s
		}
		addrs = append(addrs, a)
	}
	if scheme == "rediss" {
		c.redisTLS = true
	}
	if c.redisTLS && scheme == "redis" {
		return nil, fmt.Errorf("--redis-addrs: redis:// with --redis-tls: use rediss://")
	}
	if !c.redisTLS && (c.redisCAFile != "" || c.redisCertFile != "" || c.redisServerName != "") {
		return nil, fmt.Errorf("--redis-tls-ca-file, --redis-tls-cert-file or --redis-tls-server-name without TLS: add --redis-tls or use rediss:// addresses")
	}
	if (c.redisCertFile == "") != (c.redisKeyFile == "") {
		return nil, fmt.Errorf("--redis-tls-cert-file and --redis-tls-key-file: give both or neither")
	}
	return addrs, nil
}

// redisTLSConfig builds the TLS configuration from the files (nil without TLS). The
// CA file is read once; the client certificate and key are read at every new
// connection, so a certificate renewed in place (cert-manager, a mounted Secret) is
// used without a restart.
func (c config) redisTLSConfig() (*tls.Config, error) {
	if !c.redisTLS {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.redisServerName}
	if c.redisCAFile != "" {
		pem, err := os.ReadFile(c.redisCAFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-tls-ca-file %q: no PEM certificate in it", c.redisCAFile)
		}
		cfg.RootCAs = pool
	}
	if c.redisCertFile != "" {
		certFile, keyFile := c.redisCertFile, c.redisKeyFile
		// Load once now so a bad pair stops the start rather than every connection.
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("--redis-tls-cert-file/--redis-tls-key-file: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("--redis-tls-cert-file/--redis-tls-key-file: %w", err)
			}
			return &cert, nil
		}
	}
	return cfg, nil
}

// checkRedis asks Redis once at start. Errors that waiting cannot cure — a certificate
// the CA does not vouch for, a server that does not speak TLS (or only does), refused
// credentials or permissions — are returned naming the setting to fix, and the service
// does not start. An unreachable Redis is not one of them: it is logged, /readyz
// answers 503 until it comes, and the service starts.
func checkRedis(ctx context.Context, st *store.Store, c config) (fatal error, transient error) {
	ctx, cancel := context.WithTimeout(ctx, 2*st.Config().AttemptBudget()+time.Second)
	defer cancel()
	err := st.Ping(ctx)
	if err == nil {
		return nil, nil
	}
	if setting := redisSetting(err, c); setting != "" {
		return fmt.Errorf("%s: Redis at %s: %w", setting, c.redisAddrs, err), nil
	}
	return nil, err
}

// redisSetting names the setting an error from Redis points at ("" for none).
func redisSetting(err error, c config) string {
	var (
		unknownCA *x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		alert     tls.AlertError
		header    tls.RecordHeaderError
	)
	msg := err.Error()
	caSetting := "--redis-tls-ca-file " + quoteOr(c.redisCAFile, "(unset: the system's roots)")
	switch {
	case errors.As(err, &hostname):
		return "--redis-tls-server-name " + quoteOr(c.redisServerName, "(unset: each address's host)")
	case errors.As(err, &unknownCA), errors.As(err, &invalid), errors.As(err, &verify):
		return caSetting
	case errors.As(err, &header), strings.Contains(msg, "first record does not look like a TLS handshake"):
		return "--redis-tls (Redis does not answer TLS)"
	case errors.As(err, &alert), strings.Contains(msg, "remote error: tls:"):
		return "--redis-tls-cert-file " + quoteOr(c.redisCertFile, "(unset)") + " (Redis refused the TLS handshake)"
	case strings.HasPrefix(msg, "WRONGPASS"), strings.Contains(msg, "invalid username-password"),
		strings.HasPrefix(msg, "NOAUTH"), strings.Contains(msg, "invalid password"):
		pass := "--redis-password-file " + quoteOr(c.redisPassFile, "(unset)")
		if c.redisPassword != "" {
			pass = "--redis-password (set)"
		}
		return "--redis-username " + quoteOr(c.redisUser, "(unset: default)") + " / " + pass
	case strings.HasPrefix(msg, "NOPERM"):
		return "--redis-username " + quoteOr(c.redisUser, "(unset: default)") + " (the ACL user lacks a permission the service needs)"
	}
	return ""
}

func quoteOr(s, unset string) string {
	if s == "" {
		return unset
	}
	return fmt.Sprintf("%q", s)
}
