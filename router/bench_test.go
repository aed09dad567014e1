package router

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/otlptest"
	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/tracing"
	"github.com/warmroute/warmroute/upstream"
)

// BenchmarkPick is the whole routing decision for a 90k-token, 40-message
// continuation: canonicalize, hash, look up, pick.
func BenchmarkPick(b *testing.B) {
	body := workload.Conversation(1, 40, 360_000)
	pins := prefixcache.NewPinMap(1<<16, 4)
	var counter atomic.Uint64
	chain, _ := appendChain(nil, body)
	pins.Put(chain[37], 1)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var c prefixcache.Chains
		for pb.Next() {
			c.Read(body, prefixcache.DefaultPromptChunk)
			r, _ := Pick(Adaptive, Request{Chain: c.Messages, Avail: upstream.Mask{0b1111}}, pins, &counter)
			sinkReplica.Store(int64(r))
		}
	})
}

// BenchmarkPickCost is the default policy's whole decision for a
// 90k-token, 40-message continuation across 8 replicas, each believed to
// hold 4M tokens of other prompts and a different part of this one:
// the decision alone (look the prompt up on every replica, weigh, pick),
// and with the body's canonicalizing and hashing before it.
func BenchmarkPickCost(b *testing.B) {
	body := workload.Conversation(1, 40, 360_000)
	const replicas, kvBytes = 8, 4 << 20 * bytesPerToken
	pins := prefixcache.NewPinMap(1<<16, replicas)
	held := prefixcache.NewHoldings(replicas, DefaultHeldMemory)
	var c, other prefixcache.Chains
	c.Read(body, prefixcache.DefaultPromptChunk)
	pins.Put(c.Messages[37], 1)
	var loads Loads
	for r := range replicas {
		for i := 0; held.Held(r) < kvBytes-360_000; i++ {
			other.Read(workload.Conversation(int64(100*r+i+2), 40, 360_000), prefixcache.DefaultPromptChunk)
			held.Insert(r, other.Blocks, kvBytes)
		}
		held.Insert(r, c.Blocks[:len(c.Blocks)*r/replicas], kvBytes)
		loads[r] = Load{Queued: int64(r) * 10_000, InFlight: 2}
	}
	var counter atomic.Uint64
	pick := func() {
		req := Request{Chain: c.Messages, Blocks: c.Blocks, Held: held, Load: &loads, Size: ChainSize(c.Blocks, len(body)), Avail: upstream.Mask{1<<replicas - 1}}
		r, _ := Pick(Cost, req, pins, &counter)
		sinkReplica.Store(int64(r))
	}
	b.Run("decision", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pick()
		}
	})
	b.Run("hash+decision", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			c.Read(body, prefixcache.DefaultPromptChunk)
			pick()
		}
	})
}

// BenchmarkPickOnly is the decision alone, for a chain already hashed.
func BenchmarkPickOnly(b *testing.B) {
	body := workload.Conversation(1, 40, 360_000)
	pins := prefixcache.NewPinMap(1<<16, 4)
	var counter atomic.Uint64
	chain, _ := appendChain(nil, body)
	pins.Put(chain[37], 1)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, _ := Pick(Adaptive, Request{Chain: chain, Avail: upstream.Mask{0b1111}}, pins, &counter)
			sinkReplica.Store(int64(r))
		}
	})
}

var sinkReplica atomic.Int64

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

// BenchmarkProxyChatTraced is BenchmarkProxyChat with -otlp-endpoint set:
// each request's span is exported, in batches, to an OTLP/HTTP receiver
// on loopback. The difference is tracing's cost per request.
func BenchmarkProxyChatTraced(b *testing.B) {
	recv := otlptest.New(b, nil)
	tr, err := tracing.New(recv.URL, tracing.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Shutdown(context.Background()) })
	c := inmemoryProxyWith(b, Config{Tracer: tr}, fastReplica(b), fastReplica(b))
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
