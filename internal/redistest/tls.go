package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
)

// TLS is a set of PEM files for a server that speaks only TLS: a CA, the server's
// certificate (for 127.0.0.1 and localhost) and a client certificate, all signed by the
// CA. GenerateTLS writes one; several servers (a cluster's nodes, a Sentinel and its
// primary) share one set so that each trusts the others.
type TLS struct {
	CAFile, CertFile, KeyFile string
	ClientCertFile, ClientKey string
	// RequireClientCert makes the servers refuse clients without a certificate signed
	// by the CA (tls-auth-clients yes); otherwise a client certificate is optional.
	RequireClientCert bool
}

// GenerateTLS writes a new CA, a server certificate and a client certificate (ECDSA
// P-256, valid for a day) into dir.
func GenerateTLS(dir string) (*TLS, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"},
		NotBefore: now, NotAfter: now.Add(25 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	t := &TLS{CAFile: filepath.Join(dir, "ca.crt")}
	if err := writePEM(t.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now, NotAfter: now.Add(25 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
			// Redis nodes also dial each other (replication, cluster bus) with this
			// certificate as their client certificate.
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kb, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "PRIVATE KEY", kb)
	}
	t.CertFile, t.KeyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := leaf(2, "redis", x509.ExtKeyUsageServerAuth, t.CertFile, t.KeyFile); err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	t.ClientCertFile, t.ClientKey = filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	if err := leaf(3, "tollgate", x509.ExtKeyUsageClientAuth, t.ClientCertFile, t.ClientKey); err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	return t, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// ClientConfig is a client configuration trusting the CA and presenting the client
// certificate.
func (t *TLS) ClientConfig() (*tls.Config, error) {
	ca, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", t.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(t.ClientCertFile, t.ClientKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// serverArgs are the redis-server settings that make it listen on port with TLS only.
func (t *TLS) serverArgs(port int) []string {
	auth := "optional"
	if t.RequireClientCert {
		auth = "yes"
	}
	return []string{"--port", "0", "--tls-port", fmt.Sprint(port),
		"--tls-cert-file", t.CertFile, "--tls-key-file", t.KeyFile, "--tls-ca-cert-file", t.CAFile,
		"--tls-auth-clients", auth, "--tls-replication", "yes", "--tls-cluster", "yes"}
}

// access is how this package's own clients reach the servers it started.
type access struct {
	tls        *tls.Config
	user, pass string
}

func newAccess(o Options) (*access, error) {
	a := &access{user: o.User, pass: o.Password}
	if o.TLS != nil {
		var err error
		if a.tls, err = o.TLS.ClientConfig(); err != nil {
			return nil, fmt.Errorf("redistest TLS: %w", err)
		}
	}
	return a, nil
}

func (a *access) client(addr string, dial, read time.Duration) *redis.Client {
	o := &redis.Options{Addr: addr, DialTimeout: dial, ReadTimeout: read, MaxRetries: -1, Protocol: 2, DisableIdentity: true}
	if a != nil {
		o.Username, o.Password = a.user, a.pass
		if a.tls != nil {
			o.TLSConfig = a.tls.Clone()
		}
	}
	return redis.NewClient(o)
}

// aclArgs create the ACL user with every permission and turn the default user off, so
// that every client must authenticate; replicas authenticate to their primary as it.
func (o *Options) aclArgs() []string {
	if o.User == "" {
		return nil
	}
	return []string{"--user", o.User, "on", ">" + o.Password, "~*", "&*", "+@all",
		"--user", "default", "off", "--masteruser", o.User, "--masterauth", o.Password}
}

// cliArgs are redis-cli's connection flags for these servers.
func (o *Options) cliArgs() []string {
	var args []string
	if o.TLS != nil {
		args = append(args, "--tls", "--cacert", o.TLS.CAFile, "--cert", o.TLS.ClientCertFile, "--key", o.TLS.ClientKey)
	}
	if o.User != "" {
		args = append(args, "--user", o.User, "--pass", o.Password, "--no-auth-warning")
	}
	return args
}
