package router

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// replica is a real HTTP server on loopback standing in for vLLM.
type replica struct {
	t        *testing.T
	name     string
	addr     string
	handler  http.HandlerFunc
	requests atomic.Int64
	mu       sync.Mutex
	srv      *http.Server
}

// chatReply answers like a minimal OpenAI server and names the replica.
func chatReply(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Replica-Saw-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Replica-Saw-Xff", r.Header.Get("X-Forwarded-For"))
		w.Header().Set("X-Replica-Saw-Custom", r.Header.Get("X-Custom"))
		w.Header().Set("X-Replica-Saw-Hop", r.Header.Get("X-Hop")+r.Header.Get("Keep-Alive")+r.Header.Get("Te"))
		w.Header().Set("X-Replica-Saw-Host", r.Host)
		w.Header().Set("X-Replica-Saw-Path", r.URL.RequestURI())
		w.Header().Set("Keep-Alive", "timeout=5")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","replica":%q,"bytes":%d}`, name, len(body))
	}
}

func startReplica(t *testing.T, name string, h http.HandlerFunc) *replica {
	t.Helper()
	f := &replica{t: t, name: name, handler: h}
	if h == nil {
		f.handler = chatReply(name)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	f.serve(ln)
	t.Cleanup(f.close)
	return f
}

func (f *replica) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("User-Agent") == upstream.ProbeUserAgent {
			probeAnswer(w, r)
			return
		}
		f.requests.Add(1)
		f.handler(w, r)
	})}
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
	go srv.Serve(ln)
}

func (f *replica) url() string { return "http://" + f.addr }

// stop shuts the replica down gracefully: in-flight requests finish, idle
// connections close, new connections are refused.
func (f *replica) stop() {
	f.mu.Lock()
	srv := f.srv
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
}

func (f *replica) close() {
	f.mu.Lock()
	srv := f.srv
	f.mu.Unlock()
	srv.Close()
}

// restart listens again on the same port, as a restarted process would.
func (f *replica) restart() {
	f.t.Helper()
	f.serve(listenAgain(f.t, f.addr))
}

// listenAgain listens on addr, which a listener just closed: the port may
// take a moment to come free (bounded: one second).
func listenAgain(t testing.TB, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 100; i++ {
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("cannot listen on %s again: %v", addr, err)
	return nil
}

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// count returns how many log lines have the message msg.
func (s *syncBuffer) count(msg string) int {
	return strings.Count(s.String(), "msg="+msg+" ")
}

type proxy struct {
	ctx  context.Context // ends with the test
	addr string
	h    *Handler
	set  *upstream.Set
	logs *syncBuffer
	srv  *fasthttp.Server
}

type proxyOption func(*upstream.Config, *Config, *ServerConfig)

// startProxy runs the handler on a real loopback listener in front of urls.
func startProxy(t testing.TB, policy Policy, urls []string, opts ...proxyOption) *proxy {
	t.Helper()
	return startProxyOn(t, policy, func(c upstream.Config) (*upstream.Set, error) { return upstream.NewSet(urls, c) }, opts...)
}

// startProxyOn is startProxy on the set that makeSet returns.
func startProxyOn(t testing.TB, policy Policy, makeSet func(upstream.Config) (*upstream.Set, error), opts ...proxyOption) *proxy {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ucfg := upstream.Config{ConnectTimeout: time.Second, FirstByteTimeout: 10 * time.Second, StreamIdleTimeout: 10 * time.Second, Logger: log, HealthInterval: time.Hour}
	cfg := Config{Policy: policy, Logger: log}
	scfg := ServerConfig{MaxBodySize: 1 << 20, ReadTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second}
	for _, o := range opts {
		o(&ucfg, &cfg, &scfg)
	}
	set, err := makeSet(ucfg)
	if err != nil {
		t.Fatal(err)
	}
	pins := prefixcache.NewPinMap(4096, upstream.MaxReplicas)
	h := New(cfg, set, pins, NewMetrics(set, pins))
	srv := h.Server(scfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(Listener(ln))
	ctx, cancel := context.WithCancel(context.Background())
	set.Watch(ctx)
	t.Cleanup(func() {
		cancel()
		srv.Shutdown()
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return &proxy{addr: ln.Addr().String(), h: h, set: set, logs: logs, srv: srv, ctx: ctx}
}

func (p *proxy) url(path string) string { return "http://" + p.addr + path }

// metric returns the value of one series on the admin listener's /metrics.
func (p *proxy) metric(t *testing.T, series string) string {
	t.Helper()
	var b bytes.Buffer
	p.h.m.WritePrometheus(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimPrefix(line, series+" ")
		}
	}
	return ""
}

type result struct {
	status  int
	replica string
	route   string
	header  http.Header
	body    string
	close   bool // the proxy closes the connection after this answer
	err     error
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 20 * time.Second}

func post(p *proxy, path, body string, hdr ...string) result {
	req, _ := http.NewRequest(http.MethodPost, p.url(path), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, replica: resp.Header.Get("X-Warmroute-Replica"),
		route: resp.Header.Get("X-Warmroute-Route"), header: resp.Header, body: string(b), close: resp.Close, err: err}
}

// chat returns a chat request body of conversation c with n messages.
func chat(c, n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"system","content":"conversation ` + fmt.Sprint(c) + `"}`)
	for i := 1; i < n; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `,{"role":%q,"content":"turn %d"}`, role, i)
	}
	b.WriteString(`]}`)
	return b.String()
}

// rawReplica answers every request, read whole, with the bytes answer()
// returns, written as they are: for replies that an HTTP server library
// would not send. With keepAlive it serves the next request on the same
// connection; without, it closes the connection after each answer, without
// saying so. A /health probe gets an empty 200.
func rawReplica(t testing.TB, keepAlive bool, answer func() []byte) string {
	t.Helper()
	return scriptedReplica(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		io.Copy(io.Discard, req.Body)
		_, err := c.Write(answer())
		return err == nil && keepAlive
	})
}

// probeAnswer answers the proxy's own requests to a test replica: 200 for
// its health probe, 404 for its look at the models (the replica then
// serves every model), so that tests count only the requests they send.
func probeAnswer(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/health" {
		http.NotFound(w, r)
	}
}

// rawProbeAnswer is probeAnswer as raw bytes.
func rawProbeAnswer(r *http.Request) []byte {
	if r.URL.Path != "/health" {
		return []byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	}
	return []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
}

// dialProxy opens a raw connection to p, closed when the test ends.
func dialProxy(t *testing.T, p *proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// rawChat is a raw HTTP/1.1 POST of body to /v1/chat/completions, with
// extra header lines.
func rawChat(body, extra string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// streamRequest is a raw chat request that the replicas of sse answer
// with a stream, with extra header lines.
func streamRequest(extra string) string { return rawChat(chat(1, 3), extra) }

// readStream reads one answer from br and checks that it is the stream of
// n events that sse(n, nil) sends.
func readStream(t *testing.T, br *bufio.Reader, n int) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || strings.Count(string(got), "data: ") != n+1 || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Fatalf("stream body %q, %v", got, err)
	}
	return resp
}

// appendChain appends a chat body's prefix chain to dst.
func appendChain(dst []prefixcache.Link, body []byte) ([]prefixcache.Link, error) {
	var c prefixcache.Chains
	err := c.Read(body, 0)
	dst = append(dst, c.Messages...)
	return dst, err
}

// Pick returns the replica for req and why (Choose).
func Pick(p Policy, req Request, pins *prefixcache.PinMap, counter *atomic.Uint64) (int, Reason) {
	d := Choose(p, req, pins, counter)
	return d.Replica, d.Reason
}
