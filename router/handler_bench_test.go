package router

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// inmemoryProxy serves the handler on an in-memory listener and returns a
// client for it.
func inmemoryProxy(tb testing.TB, urls ...string) *fasthttp.HostClient {
	tb.Helper()
	return inmemoryProxyWith(tb, Config{Policy: Adaptive}, urls...)
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
