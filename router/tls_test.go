package router

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/certtest"
	"github.com/warmroute/warmroute/upstream"
)

// serveTLS serves p on a second listener, over TLS with srvTLS, as main
// does with -tls-cert-file: the TLS listener under the bare-LF watch. It
// returns a client's TLS configuration for it.
func serveTLS(t *testing.T, p *proxy) (addr string, clientTLS *tls.Config) {
	t.Helper()
	ca := certtest.NewCA(t, "front CA")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.srv.Serve(Listener(tls.NewListener(ln, ca.ServerConfig(t, "127.0.0.1"))))
	return ln.Addr().String(), ca.ClientConfig()
}

// dialTLS opens a TLS connection to addr, closed when the test ends.
func dialTLS(t *testing.T, addr string, cfg *tls.Config) *tls.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// Over TLS, the heads scanned for a bare LF are the decrypted ones: a
// bare-LF head gets its 400 at once, and a head ended by CRLFCRLF is
// served, the next one on the same connection too.
func TestTLSFrontScansDecryptedHeads(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.ReadTimeout = time.Minute
	})
	addr, clientTLS := serveTLS(t, p)
	c := dialTLS(t, addr, clientTLS)
	io.WriteString(c, "GET /v1/models HTTP/1.1\nHost: x\n\n")
	resp, body := readAnswer(t, bufio.NewReader(c), "GET")
	if resp.StatusCode != 400 || !resp.Close || !strings.Contains(body, "bare LF") {
		t.Fatalf("%d %s (close %v), want a 400 naming the bare LF", resp.StatusCode, body, resp.Close)
	}
	c = dialTLS(t, addr, clientTLS)
	br := bufio.NewReader(c)
	for i := range 2 {
		io.WriteString(c, rawChat(chat(i, 1), ""))
		if resp, body := readAnswer(t, br, "POST"); resp.StatusCode != 200 || resp.Header.Get("X-Warmroute-Replica") != a.addr {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

// A TLS client that leaves while its request waits for the replica is
// found on the TCP connection under TLS: the replica's request is
// cancelled within a poll or two, not at the first-byte timeout.
func TestTLSClientThatLeftCancelsTheReplica(t *testing.T) {
	a, started, cancelled := cancellableReplica(t)
	p := startProxy(t, Adaptive, []string{a.url()})
	addr, clientTLS := serveTLS(t, p)
	c := dialTLS(t, addr, clientTLS)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	within(t, started, 5*time.Second, "request at the replica")
	c.Close()
	within(t, cancelled, 3*time.Second, "cancellation at the replica after the client left")
	settled(t, p)
}

// recorder is a TLS listener that keeps every byte that its connections
// read: what a replica was sent, in the clear or not. It makes each
// handshake as it accepts, and drops the connections whose handshake
// fails, which the replica's server then does not log.
type recorder struct {
	net.Listener
	tls *tls.Config
	mu  sync.Mutex
	b   bytes.Buffer
}

func (l *recorder) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := tls.Server(recordedConn{c, l}, l.tls)
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			c.Close()
			continue
		}
		tc.SetDeadline(time.Time{})
		return tc, nil
	}
}

func (l *recorder) bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

type recordedConn struct {
	net.Conn
	l *recorder
}

func (c recordedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.mu.Lock()
	c.l.b.Write(p[:n])
	c.l.mu.Unlock()
	return n, err
}

// startTLSReplica is startReplica served over TLS with srvTLS; its
// listener records what it was sent.
func startTLSReplica(t *testing.T, name string, srvTLS *tls.Config) (*replica, *recorder) {
	t.Helper()
	f := &replica{t: t, name: name, handler: chatReply(name)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	rec := &recorder{Listener: ln, tls: srvTLS}
	f.serve(rec)
	t.Cleanup(f.close)
	return f, rec
}

// Of two https:// replicas, the one whose certificate the proxy's roots
// did not sign is refused at the handshake and demoted: every request is
// served by the other, and the refused one never saw a request, in the
// clear or not.
func TestTLSReplicaOfAnUnknownCAIsDemoted(t *testing.T) {
	ca, other := certtest.NewCA(t, "replicas' CA"), certtest.NewCA(t, "unknown CA")
	good, _ := startTLSReplica(t, "good", ca.ServerConfig(t, "127.0.0.1"))
	bad, sent := startTLSReplica(t, "bad", other.ServerConfig(t, "127.0.0.1"))
	p := startProxy(t, RoundRobin, []string{"https://" + bad.addr, "https://" + good.addr}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.TLS = ca.ClientConfig()
	})
	for i := range 4 {
		if r := post(p, "/v1/chat/completions", chat(i, 1)); r.err != nil || r.status != 200 || r.replica != good.addr {
			t.Fatalf("request %d: %v %d from %q: %s", i, r.err, r.status, r.replica, r.body)
		}
	}
	if p.set.Replica(0).State() != upstream.Down || p.logs.count(`"replica demoted"`) != 1 || !strings.Contains(p.logs.String(), "certificate signed by unknown authority") {
		t.Fatalf("the replica of the unknown CA is %s, want down for its certificate", upstream.StateNames[p.set.Replica(0).State()])
	}
	if bad.requests.Load() != 0 || bytes.Contains(sent.bytes(), []byte("HTTP/1.1")) {
		t.Fatalf("the refused replica was sent a request")
	}
	if len(sent.bytes()) == 0 || sent.bytes()[0] != 0x16 {
		t.Fatal("the refused replica saw no TLS handshake: the test tests nothing")
	}
}

// BenchmarkProxyTLS is BenchmarkProxyChat with TLS on the client's
// connection (front), on the connections to the replicas (upstream), and
// on both, beside the same without TLS (plain), in one run. Connections
// are kept, as a client's and the proxy's pool keep them: what TLS adds
// per request is its records' sealing and opening, and the look at what
// TLS holds before a pooled connection is reused. Besides the wall time,
// which other work on the machine stretches, it reports the process's CPU
// time per request (cpu-us/op): the client's and the replicas' as well as
// the proxy's, all in this process, so each TLS hop counts both its ends.
func BenchmarkProxyTLS(b *testing.B) {
	ca := certtest.NewCA(b, "bench CA")
	front := ca.ServerConfig(b, "proxy")
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "proxy"}
	plain := []string{fastReplica(b), fastReplica(b)}
	replicaTLS := ca.ServerConfig(b, "127.0.0.1")
	secure := []string{fastReplicaOver(b, replicaTLS), fastReplicaOver(b, replicaTLS)}
	for _, bb := range []struct {
		name string
		tls  benchTLS
		urls []string
	}{
		{"plain", benchTLS{}, plain},
		{"front", benchTLS{front: front, client: client}, plain},
		{"upstream", benchTLS{upstream: ca.ClientConfig()}, secure},
		{"both", benchTLS{front: front, client: client, upstream: ca.ClientConfig()}, secure},
	} {
		b.Run(bb.name, func(b *testing.B) {
			c := inmemoryProxyOver(b, Config{Policy: Adaptive}, bb.tls, bb.urls...)
			req, resp := chatRequest("/v1/chat/completions"), fasthttp.AcquireResponse()
			b.ReportAllocs()
			cpu := processCPU(b)
			for b.Loop() {
				doChat(b, c, req, resp)
			}
			b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
}

// processCPU returns the CPU time that the process has used, user and
// system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
