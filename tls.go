package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/warmroute/warmroute/certfile"
)

// certLookInterval is how often, at most, a handshake looks at whether the
// certificate files changed: two stat calls a second at most, and none
// while no client connects.
const certLookInterval = time.Second

// tlsSetup is what the TLS flags make: the front's and the admin
// listener's server configurations (nil: plain HTTP), the replicas'
// client configuration (upstream.Config.TLS), and the certificates that
// SIGHUP reads again.
type tlsSetup struct {
	front, admin, upstream *tls.Config
	certs                  []*certfile.Reloader
}

// setupTLS reads the TLS flags. A certificate that cannot be read, or a
// key that does not match it, is an error here, so that warmroute does
// not start (exit 2).
func setupTLS(log *slog.Logger) (*tlsSetup, error) {
	t := &tlsSetup{}
	var err error
	if t.front, err = t.server("", *tlsCert, *tlsKey, log); err != nil {
		return nil, err
	}
	if t.admin, err = t.server("admin-", *adminCert, *adminKey, log); err != nil {
		return nil, err
	}
	if t.upstream, err = upstreamTLS(*upstreamCA, *upstreamSNI, *upstreamNoV, log); err != nil {
		return nil, err
	}
	return t, nil
}

// server returns the configuration of a listener that serves the pair
// certFile and keyFile, whose flags begin with prefix; nil when both are
// unset. It offers HTTP/1.1 alone: neither server speaks HTTP/2.
func (t *tlsSetup) server(prefix, certFile, keyFile string, log *slog.Logger) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, fmt.Errorf("-%stls-cert-file and -%stls-key-file go together: set both, or neither for plain HTTP", prefix, prefix)
	}
	r, err := certfile.Load(certFile, keyFile, certLookInterval, log)
	if err != nil {
		return nil, fmt.Errorf("-%stls-cert-file, -%stls-key-file: %w", prefix, prefix, err)
	}
	t.certs = append(t.certs, r)
	return &tls.Config{GetCertificate: r.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}

// reload reads every certificate again (SIGHUP); each logs what came of
// it.
func (t *tlsSetup) reload() {
	for _, r := range t.certs {
		r.Reload()
	}
}

// listener returns ln served over TLS with cfg, or ln itself when cfg is
// nil.
func listener(ln net.Listener, cfg *tls.Config) net.Listener {
	if cfg == nil {
		return ln
	}
	return tls.NewListener(ln, cfg)
}

// upstreamTLS returns the configuration that https:// replicas are
// verified with: nil, the system's roots and each replica's own host,
// when no flag says otherwise.
func upstreamTLS(caFile, serverName string, insecure bool, log *slog.Logger) (*tls.Config, error) {
	if caFile == "" && serverName == "" && !insecure {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: serverName}
	if caFile != "" {
		if insecure {
			return nil, errors.New("-upstream-ca-file and -upstream-insecure-skip-verify are exclusive: verify the replicas with the CA file, or not at all")
		}
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("-upstream-ca-file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("-upstream-ca-file %s holds no PEM certificate", caFile)
		}
	}
	if insecure {
		cfg.InsecureSkipVerify = true
		log.Warn("-upstream-insecure-skip-verify is set: the https:// replicas' certificates are not verified, and anyone on the path to them can pose as one")
	}
	return cfg, nil
}
