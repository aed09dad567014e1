// Package certtest makes certificates for tests: a certificate authority of
// the test's own, the server certificates that it signs, and their files,
// so that a test runs real TLS handshakes that verify against roots it
// chose, and none that the machine trusts.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA's certificate, PEM-encoded: the content of a CA file.
	PEM []byte
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Leaf is a server certificate that a CA signed, PEM-encoded.
type Leaf struct {
	CertPEM, KeyPEM []byte
	// Serial tells two leaves apart in a handshake's peer certificate.
	Serial *big.Int
}

// Leaf makes a server certificate for names, each a DNS name or an IP
// address.
func (ca *CA) Leaf(t testing.TB, names ...string) Leaf {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		Serial:  tmpl.SerialNumber,
	}
}

// Pool returns a pool that holds the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientConfig returns a client's TLS configuration that trusts the CA
// alone.
func (ca *CA) ClientConfig() *tls.Config { return &tls.Config{RootCAs: ca.Pool()} }

// ServerConfig returns a server's TLS configuration that serves a new
// leaf of the CA for names.
func (ca *CA) ServerConfig(t testing.TB, names ...string) *tls.Config {
	t.Helper()
	return ca.Leaf(t, names...).ServerConfig(t)
}

// ServerConfig returns a server's TLS configuration that serves l.
func (l Leaf) ServerConfig(t testing.TB) *tls.Config {
	t.Helper()
	pair, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}}
}

// Write writes l's certificate and key to cert.pem and key.pem in dir,
// replacing what is there, and returns their paths.
func (l Leaf) Write(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	WriteFile(t, certFile, l.CertPEM)
	WriteFile(t, keyFile, l.KeyPEM)
	return certFile, keyFile
}

// WriteFile replaces the file at path with b in one rename, as a
// Kubernetes Secret's update does: a reader sees the old file or the new
// one, never a part.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
