package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/warmroute/warmroute/benchmarks/redistest"
	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/pinstore"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// The fakes that the package's tests run the proxy against, and the
// harness around them: the proxy on a loopback listener; its clients;
// replicas that are real HTTP servers, scripted ones that write raw bytes,
// and ones that fail as a process or a host does; a DNS server; and an
// in-memory proxy in front of a replica that allocates nothing, for the
// allocation tests and the benchmarks.

// The proxy under test.

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
	ln := listenLoopback(t)
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

// settled checks that nothing of p's requests is left counted once they
// are answered: nothing in flight, waiting or queued on a replica.
func settled(t *testing.T, p *proxy) {
	t.Helper()
	waitFor(t, "every count back to 0", func() bool {
		for _, r := range p.set.Replicas() {
			if w, q := r.Waiting(); r.InFlight() != 0 || w != 0 || q != 0 {
				return false
			}
		}
		return true
	})
}

// Clients of the proxy.

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

// readAnswer reads one answer to a request of method from br, its body
// whole.
func readAnswer(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading a %d answer's body: %q %v", resp.StatusCode, b, err)
	}
	return resp, string(b)
}

// rawHead is a raw HEAD request, with extra header lines.
func rawHead(extra string) string {
	return "HEAD /v1/models/m HTTP/1.1\r\nHost: p\r\n" + extra + "\r\n"
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

// streamTwice sends two stream requests on one connection to p, one after
// the other, and checks that each answer's body is want.
func streamTwice(t *testing.T, p *proxy, want []byte, what string) {
	t.Helper()
	c := dialProxy(t, p)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i := range 2 {
		io.WriteString(c, streamRequest(""))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s, answer %d: %v", what, i, err)
		}
		if got, err := io.ReadAll(resp.Body); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s, answer %d: %d bytes (want %d), %v", what, i, len(got), len(want), err)
		}
	}
}

// rawClient sends requests on one client connection and returns what
// came back for each, read as raw bytes up to the end of its final answer.
type rawClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

// do sends a chat request and returns the interim heads (raw) and the final
// response, read whole.
func (rc *rawClient) do(body string) (interim []string, resp *http.Response, respBody string) {
	rc.t.Helper()
	rc.c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(rc.c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	for {
		var head strings.Builder
		for {
			line, err := rc.br.ReadString('\n')
			if err != nil {
				rc.t.Fatalf("reading a head: %q %v", head.String(), err)
			}
			head.WriteString(line)
			if line == "\r\n" {
				break
			}
		}
		if strings.HasPrefix(head.String(), "HTTP/1.1 1") {
			interim = append(interim, head.String())
			continue
		}
		r, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(head.String()), rc.br)), nil)
		if err != nil {
			rc.t.Fatal(err)
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			rc.t.Fatalf("final body: %v", err)
		}
		return interim, r, string(b)
	}
}

// readCut reads one answer from c and checks that it is a stream that
// the proxy cut: its body ends in an error, never a clean end.
func readCut(t *testing.T, c net.Conn) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("a stream that should be cut ended cleanly after %d bytes", len(got))
	}
	if isTimeout(err) {
		t.Fatalf("the stream was not cut: the test's deadline passed after %d bytes", len(got))
	}
}

// Waiting for what happens elsewhere.

// waitFor polls cond until it holds; 10 s without it fails the test.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// within fails the test if ch is not closed within d.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("no %s within %v", what, d)
	}
}

// Replicas that are HTTP servers of net/http, or engines simulated.

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
	ln := listenLoopback(t)
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

// listenLoopback listens on a free port of 127.0.0.1.
func listenLoopback(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
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

// probeAnswer answers the proxy's own requests to a test replica: 200 for
// its health probe, 404 for its look at the models (the replica then
// serves every model), so that tests count only the requests they send.
func probeAnswer(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/health" {
		http.NotFound(w, r)
	}
}

// sse writes n events, calling before(i) ahead of event i.
func sse(n int, before func(i int)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for i := 0; i < n; i++ {
			if before != nil {
				before(i)
			}
			fmt.Fprintf(w, "data: {\"chunk\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// hangUp reads a request whole and closes its connection without an
// answer: the replica had the request (closing on unread bytes would send
// a reset, which says that it was never read).
func hangUp(w http.ResponseWriter, r *http.Request) {
	io.ReadAll(r.Body)
	c, _, _ := w.(http.Hijacker).Hijack()
	c.Close()
}

// loopbackTrio starts three replicas on 127.0.0.2, .3 and .4 at one port,
// as the pods behind a headless Service are: one name, one port, several
// addresses.
func loopbackTrio(t *testing.T) (port string, reps []*replica) {
	t.Helper()
	for try := 0; try < 20; try++ {
		first, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skip("no 127.0.0.2 on this machine:", err)
		}
		_, port, _ = net.SplitHostPort(first.Addr().String())
		lns := []net.Listener{first}
		for _, ip := range []string{"127.0.0.3", "127.0.0.4"} {
			ln, err := net.Listen("tcp", ip+":"+port)
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) < 3 {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		for i, ln := range lns {
			f := &replica{t: t, name: fmt.Sprint("r", i), addr: ln.Addr().String()}
			f.handler = chatReply(f.name)
			f.serve(ln)
			t.Cleanup(f.close)
			reps = append(reps, f)
		}
		return port, reps
	}
	t.Fatal("no port free on three loopback addresses")
	return "", nil
}

// cacheReplica is a vLLM-like replica on loopback: it publishes a KV
// capacity of blocks x 16 tokens on /metrics (none for 0), and answers
// each chat request with the usage that cached returns for it.
func cacheReplica(t *testing.T, name string, blocks int, cached func(prompt int) int) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/metrics":
			if blocks == 0 {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"%d\",prefix_caching_hash_algo=\"sha256\"} 1.0\n", blocks)
		case "/v1/chat/completions":
			body, _ := io.ReadAll(r.Body)
			prompt := len(body) / 4
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","replica":%q,"usage":{"prompt_tokens":%d,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":%d}}}`, name, prompt, cached(prompt))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// startSim runs a simulated replica that serves exactly models.
func startSim(t *testing.T, models ...string) *sim.Replica {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.TimeScale, cfg.Served = 1000, models
	r, err := sim.NewReplica("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// Scripted replicas, which write raw bytes: answers that an HTTP server
// library would not send, at the pace and with the faults that a test
// chooses.

// scriptedReplica serves each connection with serve, after answering the
// proxy's own probes; serve gets the connection, its reader and the
// request, its body unread, and reports whether to read the next one.
func scriptedReplica(t testing.TB, serve func(c net.Conn, br *bufio.Reader, req *http.Request) bool) string {
	t.Helper()
	ln := listenLoopback(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.Header.Get("User-Agent") == upstream.ProbeUserAgent {
						io.Copy(io.Discard, req.Body)
						if _, err := c.Write(rawProbeAnswer(req)); err != nil {
							return
						}
						continue
					}
					if !serve(c, br, req) {
						return
					}
				}
			}(c)
		}
	}()
	return "http://" + ln.Addr().String()
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

// rawProbeAnswer is probeAnswer as raw bytes.
func rawProbeAnswer(r *http.Request) []byte {
	if r.URL.Path != "/health" {
		return []byte("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	}
	return []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
}

// jsonAnswer is a whole 200 answer with body.
func jsonAnswer(body string) string {
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// sizeLine is a chunk's size line.
func sizeLine(size int) string { return strconv.FormatInt(int64(size), 16) + "\r\n" }

// oneChunk is a replica's answer: a stream of one chunk, data.
func oneChunk(data []byte) []byte {
	return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		sizeLine(len(data)) + string(data) + "\r\n0\r\n\r\n")
}

// trickler is a replica that answers with an SSE stream framed by chunks
// and then writes one byte every tick, and never ends it.
func trickler(t *testing.T, tick time.Duration) string {
	return scriptedReplica(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		io.Copy(io.Discard, req.Body)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
			return false
		}
		tk := time.NewTicker(tick) // the replica's pace, not a synchronisation
		defer tk.Stop()
		for range tk.C {
			if _, err := io.WriteString(c, "1\r\n.\r\n"); err != nil {
				return false
			}
		}
		return false
	})
}

// resetMidRequest is a replica that answers the proxy's probes, and resets
// the connection of any other request once it has read part of its body:
// it never had the request whole. reset receives once per reset.
func resetMidRequest(t *testing.T, part int64, reset chan<- struct{}) string {
	t.Helper()
	ln := listenLoopback(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c *net.TCPConn) {
				defer c.Close()
				c.SetReadBuffer(16 << 10)
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.Header.Get("User-Agent") == upstream.ProbeUserAgent {
						io.Copy(io.Discard, req.Body)
						c.Write(rawProbeAnswer(req))
						continue
					}
					io.CopyN(io.Discard, req.Body, part)
					c.SetLinger(0)
					c.Close()
					reset <- struct{}{}
					return
				}
			}(c.(*net.TCPConn))
		}
	}()
	return "http://" + ln.Addr().String()
}

// Replicas that fail as a host or a process does.

// blackHole returns an address whose connects time out: a listener with a
// full accept queue that never accepts, so the kernel drops further SYNs.
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the accept queue until a connect times out.
	for i := 0; i < 8; i++ {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return addr
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("cannot make a black-holed listener on this kernel")
	return ""
}

// killableReplica reads requests on keep-alive connections and answers each
// at once, recording the X-Request-Id of every request it read whole. Its
// kill-th request (counting from 1 in each life) is read and recorded but
// never answered: the replica dies on it the way kill -9 kills a process,
// its listener and every connection closed at once, and it listens again
// on the same port when restart is called.
type killableReplica struct {
	t     *testing.T
	addr  string
	kill  int
	seen  sync.Map // request id -> true
	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	n     int
	died  chan struct{} // receives once per death
}

func startKillable(t *testing.T, kill int) *killableReplica {
	k := &killableReplica{t: t, kill: kill, died: make(chan struct{}, 16)}
	ln := listenLoopback(t)
	k.addr = ln.Addr().String()
	k.serve(ln)
	t.Cleanup(k.die)
	return k
}

func (k *killableReplica) serve(ln net.Listener) {
	k.mu.Lock()
	k.ln, k.conns, k.n = ln, map[net.Conn]bool{}, 0
	k.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			k.mu.Lock()
			if k.ln != ln {
				k.mu.Unlock()
				c.Close()
				return
			}
			k.conns[c] = true
			k.mu.Unlock()
			go k.conn(c)
		}
	}()
}

func (k *killableReplica) conn(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			// Half a body, cut by this replica's own death: a server
			// runs no such request, and the proxy may send it again.
			// (The race build writes a request's head and body in two
			// writes, so the death can fall between them.)
			return
		}
		if req.Header.Get("User-Agent") == upstream.ProbeUserAgent {
			c.Write(rawProbeAnswer(req))
			continue
		}
		k.seen.Store(req.Header.Get("X-Request-Id"), true)
		k.mu.Lock()
		k.n++
		dies := k.n == k.kill
		k.mu.Unlock()
		if dies {
			k.die()
			k.died <- struct{}{}
			return
		}
		if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")); err != nil {
			return
		}
	}
}

// die closes the listener and every connection, as the kernel does for a
// process killed with SIGKILL.
func (k *killableReplica) die() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ln != nil {
		k.ln.Close()
	}
	k.ln = nil
	for c := range k.conns {
		c.Close()
	}
	k.conns = map[net.Conn]bool{}
}

func (k *killableReplica) restart() {
	k.t.Helper()
	k.serve(listenAgain(k.t, k.addr))
}

// hungReplica accepts connections and never reads or answers anything, its
// health path included: a wedged process, or one stopped with SIGSTOP.
func hungReplica(t *testing.T) string {
	t.Helper()
	ln := listenLoopback(t)
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return "http://" + ln.Addr().String()
}

// Discovery.

// dnsServer is a DNS server on loopback that answers A queries for one
// name with the addresses the test sets, and nothing else: the resolver a
// Kubernetes headless Service would be, under the test's control.
type dnsServer struct {
	name  string // fully qualified, with the trailing dot
	mu    sync.Mutex
	addrs []netip.Addr
	conn  net.PacketConn
}

func startDNS(t *testing.T, name string, addrs ...string) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{name: name + ".", conn: pc}
	s.set(addrs...)
	t.Cleanup(func() { pc.Close() })
	go s.serve()
	return s
}

func (s *dnsServer) set(addrs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrs = s.addrs[:0]
	for _, a := range addrs {
		s.addrs = append(s.addrs, netip.MustParseAddr(a))
	}
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		hdr, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true})
		b.EnableCompression()
		b.StartQuestions()
		b.Question(q)
		b.StartAnswers()
		if strings.EqualFold(q.Name.String(), s.name) && q.Type == dnsmessage.TypeA {
			s.mu.Lock()
			for _, a := range s.addrs {
				b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: a.As4()})
			}
			s.mu.Unlock()
		}
		msg, err := b.Finish()
		if err == nil {
			s.conn.WriteTo(msg, from)
		}
	}
}

// resolver returns a Go resolver that asks only s.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.conn.LocalAddr().String())
	}}
}

// The in-memory proxy and a replica that allocates nothing.

// fastReplica is a fasthttp server on loopback that answers every request
// with a fixed chat completion, or with an SSE stream of 16 events and a
// usage chunk, both with vLLM's usage; it allocates nothing itself, so
// what a benchmark counts is the proxy's.
func fastReplica(tb testing.TB) string { return fastReplicaOver(tb, nil) }

// fastReplicaOver is fastReplica, served over TLS with srvTLS if it is not
// nil.
func fastReplicaOver(tb testing.TB, srvTLS *tls.Config) string {
	tb.Helper()
	completion := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":96,"total_tokens":97,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":80}}}`)
	event := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n")
	usage := []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":96,\"total_tokens\":112,\"completion_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":80}}}\n\ndata: [DONE]\n\n")
	ln := listenLoopback(tb)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/sse" {
			ctx.SetContentType("text/event-stream")
			ev := eventPool.Get().(*events)
			ev.left, ev.event, ev.last = 16, event, usage
			ctx.SetBodyStream(ev, -1)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(completion)
	}}
	scheme := "http://"
	if srvTLS != nil {
		ln, scheme = tls.NewListener(ln, srvTLS), "https://"
	}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Shutdown() })
	return scheme + ln.Addr().String()
}

// events is a pooled SSE body: one event per Read, so fasthttp writes and
// flushes each as its own chunk, as an engine streaming tokens does.
type events struct {
	left        int
	event, last []byte // last: the usage chunk and [DONE], after the events
}

var eventPool = sync.Pool{New: func() any { return new(events) }}

func (e *events) Read(p []byte) (int, error) {
	if e.left == 0 {
		if e.last != nil {
			n := copy(p, e.last)
			e.last = nil
			return n, nil
		}
		return 0, io.EOF
	}
	e.left--
	return copy(p, e.event), nil
}

func (e *events) Close() error {
	eventPool.Put(e)
	return nil
}

// inmemoryProxyWith is inmemoryProxy with cfg (its Logger discards).
func inmemoryProxyWith(tb testing.TB, cfg Config, urls ...string) *fasthttp.HostClient {
	tb.Helper()
	c, _, _ := inmemoryHandler(tb, cfg, benchTLS{}, urls...)
	return c
}

// inmemoryProxyOver is inmemoryProxyWith with TLS where t says.
func inmemoryProxyOver(tb testing.TB, cfg Config, t benchTLS, urls ...string) *fasthttp.HostClient {
	tb.Helper()
	c, _, _ := inmemoryHandler(tb, cfg, t, urls...)
	return c
}

// benchTLS is the TLS of a benchmark's proxy, each side nil for none:
// front serves the client, which verifies it with client; upstream
// verifies the replicas.
type benchTLS struct{ front, client, upstream *tls.Config }

// inmemoryHandler is inmemoryProxyOver that also returns the handler, and
// how many streams learnStreams sent through it.
func inmemoryHandler(tb testing.TB, cfg Config, t benchTLS, urls ...string) (*fasthttp.HostClient, *Handler, int) {
	tb.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Logger = log
	// The fast replica streams its answer on /sse: a path admitted as an
	// operator would admit one, which the allowlist then reads whole.
	cfg.ForwardPaths = append(cfg.ForwardPaths, "/sse")
	set, err := upstream.NewSet(urls, upstream.Config{Logger: log, HealthInterval: time.Hour, TLS: t.upstream})
	if err != nil {
		tb.Fatal(err)
	}
	pins := prefixcache.NewPinMap(1<<12, len(urls))
	h := New(cfg, set, pins, NewMetrics(set, pins))
	ln := fasthttputil.NewInmemoryListener()
	scfg := ServerConfig{MaxBodySize: 1 << 20, ReadTimeout: time.Minute, IdleTimeout: time.Minute}
	srv := h.Server(scfg)
	var front net.Listener = ln
	if t.front != nil {
		front = tls.NewListener(ln, t.front)
	}
	go srv.Serve(front)
	tb.Cleanup(func() { ln.Close() })
	dial := func(string) (net.Conn, error) {
		c, err := ln.Dial()
		if err != nil || t.client == nil {
			return c, err
		}
		return tls.Client(c, t.client), nil
	}
	c := &fasthttp.HostClient{Addr: "proxy", Dial: dial, MaxConns: 64}
	sent := learnStreams(tb, c, set)
	return c, h, sent
}

// learnStreams streams through c until every replica of set was seen
// keeping its connection after a stream: until then, no such connection
// is reused, and each stream dials one. It returns how many it sent.
func learnStreams(tb testing.TB, c *fasthttp.HostClient, set *upstream.Set) (sent int) {
	tb.Helper()
	req, resp := chatRequest("/sse"), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for deadline := time.Now().Add(10 * time.Second); ; {
		learnt := true
		for _, r := range set.Replicas() {
			learnt = learnt && r.KeepsStreamConns()
		}
		if learnt {
			return sent
		}
		if time.Now().After(deadline) {
			tb.Fatal("the replicas' connections after a stream were not learnt in 10 s")
		}
		doChat(tb, c, req, resp)
		sent++
	}
}

const benchChat = `{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant that writes Go."},{"role":"user","content":"Write a function that reverses a string."},{"role":"assistant","content":"func reverse(s string) string { r := []rune(s); for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 { r[i], r[j] = r[j], r[i] }; return string(r) }"},{"role":"user","content":"Now make it handle combining characters."}],"max_tokens":64}`

func doChat(tb testing.TB, c *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) {
	if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
		tb.Fatalf("proxy: %v %d %s", err, resp.StatusCode(), resp.Body())
	}
}

func chatRequest(path string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://proxy" + path)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(benchChat)
	return req
}

// openStore opens a pin store on a real redis-server for the test.
func openStore(tb testing.TB) *pinstore.Store {
	tb.Helper()
	r := redistest.Start(tb)
	st, err := pinstore.Open(r.URL(), pinstore.Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(st.Close)
	redistest.Eventually(tb, st.Up)
	return st
}

// Routing decisions without a proxy.

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

// sized is conversation c's first n messages, each per bytes long, with
// Check as Chains.Read makes it (count, cumulative bytes); shared is how
// many leading messages it has in common with every other conversation.
func sized(c, n, shared int, per uint64) []prefixcache.Link {
	chain := make([]prefixcache.Link, n)
	var h uint64
	for i := range chain {
		id := uint64(c)
		if i < shared {
			id = 0
		}
		h = h*0x9E3779B97F4A7C15 ^ (id*0xC2B2AE3D27D4EB4F + uint64(i+1))
		chain[i] = prefixcache.Link{Hash: h, Check: uint64(i+1)<<40 | per*uint64(i+1)}
	}
	return chain
}

// cancellableReplica is a replica that holds its first request for up to
// 6 s: started is closed when it has the request, cancelled when the
// request is cancelled (its connection closed) before then.
func cancellableReplica(t *testing.T) (a *replica, started, cancelled chan struct{}) {
	t.Helper()
	started, cancelled = make(chan struct{}), make(chan struct{})
	a = startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		close(started)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(6 * time.Second):
		}
	})
	return a, started, cancelled
}
