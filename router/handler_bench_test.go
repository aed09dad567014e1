package router

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/warmroute/warmroute/benchmarks/redistest"
	"github.com/warmroute/warmroute/pinstore"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
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

// inmemoryProxy serves the handler on an in-memory listener and returns a
// client for it.
func inmemoryProxy(tb testing.TB, urls ...string) *fasthttp.HostClient {
	tb.Helper()
	return inmemoryProxyWith(tb, Config{Policy: Adaptive}, urls...)
}

// inmemoryProxyWith is inmemoryProxy with cfg (its Logger discards).
func inmemoryProxyWith(tb testing.TB, cfg Config, urls ...string) *fasthttp.HostClient {
	tb.Helper()
	return inmemoryProxyOver(tb, cfg, benchTLS{}, urls...)
}

// benchTLS is the TLS of a benchmark's proxy, each side nil for none:
// front serves the client, which verifies it with client; upstream
// verifies the replicas.
type benchTLS struct{ front, client, upstream *tls.Config }

// inmemoryProxyOver is inmemoryProxyWith with TLS where t says.
func inmemoryProxyOver(tb testing.TB, cfg Config, t benchTLS, urls ...string) *fasthttp.HostClient {
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
	learnStreams(tb, c, set)
	return c
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

// BenchmarkProxyChat proxies a non-streamed chat completion through the
// real handler and reports allocations per request: the proxy's, since the
// client and the replica allocate nothing in steady state.
func BenchmarkProxyChat(b *testing.B) {
	c := inmemoryProxy(b, fastReplica(b), fastReplica(b))
	req, resp := chatRequest("/v1/chat/completions"), fasthttp.AcquireResponse()
	b.ReportAllocs()
	for b.Loop() {
		doChat(b, c, req, resp)
	}
}

// BenchmarkProxySSE proxies a 16-event SSE answer.
func BenchmarkProxySSE(b *testing.B) {
	c := inmemoryProxy(b, fastReplica(b), fastReplica(b))
	req, resp := chatRequest("/sse"), fasthttp.AcquireResponse()
	b.ReportAllocs()
	for b.Loop() {
		doChat(b, c, req, resp)
	}
}

// BenchmarkProxyChatPinStore is BenchmarkProxyChat with rendezvous
// placement and a Redis pin store: the same request again, whose newest
// link is pinned here, asks the store nothing, so it costs what it costs
// without one.
func BenchmarkProxyChatPinStore(b *testing.B) {
	c := inmemoryProxyWith(b, Config{Policy: Adaptive, Rendezvous: true, PinStore: openStore(b)}, fastReplica(b), fastReplica(b))
	req, resp := chatRequest("/v1/chat/completions"), fasthttp.AcquireResponse()
	b.ReportAllocs()
	for b.Loop() {
		doChat(b, c, req, resp)
	}
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
