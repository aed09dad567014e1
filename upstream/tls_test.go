package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/certtest"
)

// tlsPeer is the replica's end of a TLS connection: the test plays the
// replica on it, and reaches its socket through tcp.
type tlsPeer struct {
	*tls.Conn
	tcp *net.TCPConn
	out *heldWrites
}

// heldWrites is the socket under a replica's TLS connection, whose writes
// can be held and then sent in one, so that two records reach the proxy
// in one segment.
type heldWrites struct {
	*net.TCPConn
	mu   sync.Mutex
	held *bytes.Buffer
}

func (h *heldWrites) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held != nil {
		return h.held.Write(p)
	}
	return h.TCPConn.Write(p)
}

// hold holds the writes from now until send.
func (h *heldWrites) hold() {
	h.mu.Lock()
	h.held = &bytes.Buffer{}
	h.mu.Unlock()
}

// send writes what was held in one write.
func (h *heldWrites) send() {
	h.mu.Lock()
	b := h.held.Bytes()
	h.held = nil
	h.mu.Unlock()
	h.TCPConn.Write(b)
}

// startTLSTestReplica is startTestReplica for an https:// replica that
// serves srvTLS: each connection accepted is handshaken and sent on the
// channel returned; one whose handshake fails is sent too, with the
// handshake's error.
func startTLSTestReplica(t *testing.T, cfg Config, srvTLS *tls.Config) (*Replica, <-chan *tlsPeer, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted, failed := make(chan *tlsPeer, 16), make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			out := &heldWrites{TCPConn: c.(*net.TCPConn)}
			p := &tlsPeer{Conn: tls.Server(out, srvTLS), tcp: out.TCPConn, out: out}
			go func() {
				p.SetDeadline(time.Now().Add(10 * time.Second))
				if err := p.Handshake(); err != nil {
					failed <- err
					return
				}
				p.SetDeadline(time.Time{})
				accepted <- p
			}()
		}
	}()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := NewSet([]string{"https://" + ln.Addr().String()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s.Replica(0), accepted, failed
}

// An https:// replica is verified against the roots and the name that
// Config.TLS gives (-upstream-ca-file, -upstream-server-name): its
// certificate names replica.test, not the address it is reached at. A
// request goes over TLS, and the connection is pooled and reused as a
// plain one is; a new one resumes the replica's session.
func TestTLSReplica(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	tlsCfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "replica.test"}
	srvTLS := ca.ServerConfig(t, "replica.test")
	srvTLS.NextProtos = []string{"h2", "http/1.1"}
	r, accepted, _ := startTLSTestReplica(t, Config{TLS: tlsCfg, TrustIdle: -1}, srvTLS)
	c, srv := acquire(t, r, accepted)
	if st := c.nc.(*tls.Conn).ConnectionState(); st.NegotiatedProtocol != "http/1.1" || st.ServerName != "replica.test" {
		t.Fatalf("handshake offered %q as the name and agreed %q; want replica.test and http/1.1", st.ServerName, st.NegotiatedProtocol)
	}
	for i := range 2 {
		got := serve(srv, 10, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		var resp fasthttp.Response
		if err := roundTripWithin(t, c, 10, &resp.Header, nil, nil); err != nil {
			t.Fatal(err)
		}
		if err := c.ReadWhole(&resp, 0); err != nil || string(resp.Body()) != "ok" {
			t.Fatalf("request %d: body %q, %v", i, resp.Body(), err)
		}
		if head, body := request(10); !bytes.Equal(<-got, append(head, body...)) {
			t.Fatalf("request %d reached the replica otherwise than it was written", i)
		}
		c.Release(time.Now())
		again, _ := acquire(t, r, accepted)
		if again != c || !again.Reused {
			t.Fatalf("request %d: the TLS connection was not reused", i)
		}
	}
	// A new connection resumes the session that the replica's ticket,
	// read with the answers, left.
	c.MarkBroken()
	c.Release(time.Now())
	if fresh, _ := acquire(t, r, accepted); fresh.Reused || !fresh.nc.(*tls.Conn).ConnectionState().DidResume {
		t.Fatal("a new connection to the replica did not resume its session")
	}
}

// An https:// replica whose certificate no root of the proxy's signed is
// refused at the handshake: the request is not sent, there or anywhere in
// the clear, and the error is a dial's, which demotes the replica and
// sends the request to another. Its probe fails too.
func TestTLSReplicaOfAnUnknownCA(t *testing.T) {
	ca, other := certtest.NewCA(t, "test CA"), certtest.NewCA(t, "unknown CA")
	r, _, failed := startTLSTestReplica(t, Config{TLS: ca.ClientConfig()}, other.ServerConfig(t, "127.0.0.1"))
	c, e := r.Acquire(time.Now())
	var unknown x509.UnknownAuthorityError
	if e == nil || e.Phase != PhaseDial || !errors.As(e, &unknown) {
		t.Fatalf("Acquire = %v, %v; want a dial error of an unknown authority", c, e)
	}
	if v := Judge(e, Attempt{Sends: 1, MaxSends: 2, Others: true}); v != (Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}) {
		t.Fatalf("judged %+v", v)
	}
	if err := within(t, failed); err == nil {
		t.Fatal("the replica's handshake succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.set.Watch(ctx)
	if err := r.Probe(ctx, r.set.client); !errors.As(err, &unknown) {
		t.Fatalf("probe = %v, want an unknown authority", err)
	}
}

// The proxy's own requests to an https:// replica, its probe, its reads of
// the models and the KV capacity and its scrape of the queue, go over TLS,
// verified against Config.TLS's roots.
func TestTLSProbesAndScrapes(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model"}]}`)
		case "/metrics":
			io.WriteString(w, vllmPage)
		case "/get_server_info":
			io.WriteString(w, `{"max_total_num_tokens":50000}`)
		default:
			http.NotFound(w, r)
		}
	}))
	srv.TLS = ca.ServerConfig(t, "127.0.0.1")
	srv.StartTLS()
	defer srv.Close()
	s, err := NewSet([]string{srv.URL}, Config{TLS: ca.ClientConfig(), ScrapeInterval: time.Hour, HealthInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.Watch(ctx)
	r := s.Replica(0)
	if err := r.Probe(ctx, s.client); err != nil {
		t.Fatalf("probe: %v", err)
	}
	r.fetchModels(ctx, s.client)
	if names := s.ModelNames(); len(names) != 1 || names[0] != "Qwen/Qwen3-8B" {
		t.Fatalf("models %q", names)
	}
	r.fetchCapacity(ctx, s.client)
	if r.KVTokens() != 50000 {
		t.Fatalf("KV capacity %d, want 50000", r.KVTokens())
	}
	if rep, err := r.scrape(ctx, s.scrapeClient); err != nil || rep.Waiting != 3 {
		t.Fatalf("scrape %+v, %v", rep, err)
	}
}
