package certfile_test

import (
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"

	"github.com/warmroute/warmroute/benchmarks/certtest"
	"github.com/warmroute/warmroute/certfile"
)

// logBuffer is a log that tests read while the server writes it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve runs an HTTPS server on loopback whose certificate is r's.
func serve(t *testing.T, r *certfile.Reloader) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(tls.NewListener(ln, &tls.Config{GetCertificate: r.GetCertificate}))
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String() + "/"
}

// get asks url with client and returns the serial of the certificate that
// its connection's handshake met, and whether the connection was reused.
func get(t *testing.T, client *http.Client, url string) (*big.Int, bool) {
	t.Helper()
	var reused bool
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
		t.Fatalf("answer %q, %v", b, err)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber, reused
}

func newClient(ca *certtest.CA) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
}

// Replacing the files serves the new certificate to the next handshake,
// while a keep-alive connection opened before goes on with the session it
// has. A pair that does not match (the certificate replaced before its
// key) keeps the certificate served, and the log says why.
func TestReplacedFilesServeNewHandshakes(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	dir := t.TempDir()
	first := ca.Leaf(t, "127.0.0.1")
	certFile, keyFile := first.Write(t, dir)
	logs := &logBuffer{}
	r, err := certfile.Load(certFile, keyFile, 0, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, r)

	kept := newClient(ca)
	if serial, _ := get(t, kept, url); serial.Cmp(first.Serial) != 0 {
		t.Fatalf("first handshake met serial %v, want %v", serial, first.Serial)
	}

	second := ca.Leaf(t, "127.0.0.1")
	second.Write(t, dir)
	if serial, reused := get(t, newClient(ca), url); serial.Cmp(second.Serial) != 0 || reused {
		t.Fatalf("a new connection after the files were replaced met serial %v (reused %v), want %v", serial, reused, second.Serial)
	}
	if serial, reused := get(t, kept, url); !reused || serial.Cmp(first.Serial) != 0 {
		t.Fatalf("the connection opened before the change: reused %v, serial %v; want it kept, with serial %v", reused, serial, first.Serial)
	}

	// The certificate of a third pair, with the second's key.
	certtest.WriteFile(t, certFile, ca.Leaf(t, "127.0.0.1").CertPEM)
	for range 2 {
		if serial, _ := get(t, newClient(ca), url); serial.Cmp(second.Serial) != 0 {
			t.Fatalf("after a bad change, a new connection met serial %v, want the old %v", serial, second.Serial)
		}
	}
	if log := logs.String(); !strings.Contains(log, "certificate not reloaded; the old one stays") || !strings.Contains(log, "private key does not match public key") {
		t.Fatalf("the log does not say why the bad pair was not served:\n%s", log)
	}
	if n := strings.Count(logs.String(), "certificate not reloaded"); n != 1 {
		t.Fatalf("the bad pair was logged %d times, want once until a file changes again", n)
	}
}

// SIGHUP's Reload reads the files even when the look at them finds no
// change: they may have been restored with their old time.
func TestReloadReadsUnchangedFiles(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	dir := t.TempDir()
	first := ca.Leaf(t, "127.0.0.1")
	certFile, keyFile := first.Write(t, dir)
	r, err := certfile.Load(certFile, keyFile, 1<<62, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, r)
	second := ca.Leaf(t, "127.0.0.1")
	second.Write(t, dir)
	if serial, _ := get(t, newClient(ca), url); serial.Cmp(first.Serial) != 0 {
		t.Fatal("the files were looked at before the interval ran out")
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if serial, _ := get(t, newClient(ca), url); serial.Cmp(second.Serial) != 0 {
		t.Fatalf("after Reload, serial %v, want %v", serial, second.Serial)
	}
}

// A pair that cannot serve fails Load, with the file and the reason.
func TestLoadRefusesABadPair(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	dir := t.TempDir()
	certFile, keyFile := ca.Leaf(t, "a").Write(t, dir)
	other := t.TempDir()
	_, otherKey := ca.Leaf(t, "b").Write(t, other)
	for _, tt := range []struct {
		name, cert, key, want string
	}{
		{"missing certificate", dir + "/none.pem", keyFile, "no such file"},
		{"missing key", certFile, dir + "/none.pem", "no such file"},
		{"key of another certificate", certFile, otherKey, "private key does not match public key"},
		{"not PEM", keyFile, keyFile, "failed to find certificate PEM data"},
	} {
		_, err := certfile.Load(tt.cert, tt.key, 0, slog.Default())
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.cert) {
			t.Errorf("%s: Load = %v; want an error naming %s with %q", tt.name, err, tt.cert, tt.want)
		}
	}
}
