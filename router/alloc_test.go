//go:build !race

package router

import (
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

func TestPickAllocatesNothing(t *testing.T) {
	body := workload.Conversation(1, 40, 360_000)
	pins := prefixcache.NewPinMap(1<<12, 4)
	var counter atomic.Uint64
	chain := make([]prefixcache.Link, 0, 64)
	chain, _ = prefixcache.AppendChain(chain, body)
	pins.Put(chain[30], 2)
	n := testing.AllocsPerRun(50, func() {
		var err error
		chain, err = prefixcache.AppendChain(chain[:0], body)
		if err != nil {
			t.Fatal(err)
		}
		if r, reason := Pick(Adaptive, Request{Chain: chain, Avail: upstream.MaskOf(0b1111)}, pins, &counter); r != 2 || reason != Pinned {
			t.Fatalf("Pick = %d %v", r, reason)
		}
	})
	if n != 0 {
		t.Fatalf("canonicalize+hash+pick allocates %.1f times per request, want 0", n)
	}
}

// allocsOf is what a request to path allocates in the tests below: a chat
// completion nothing, and a relayed stream (cfg relays every stream unless
// RelayAbove is negative) one object, the closure of fasthttp's go
// statement that starts the hijack handler (relay.go), which the proxy
// cannot pool; a stream that fasthttp writes, nothing. A request whose
// wait is relayed (RelayWaitingAbove 0) is hijacked once too, whatever
// its answer.
func allocsOf(path string, cfg Config) float64 {
	if cfg.RelayWaitingAbove >= 0 || path == "/sse" && cfg.RelayAbove >= 0 {
		return 1
	}
	return 0
}

// A whole proxied request, through the real handler and a real pooled
// connection to a replica, allocates nothing in steady state: a chat
// completion read whole, and an SSE answer relayed as a stream. The test
// client and the replica allocate nothing themselves, so what is counted is
// the proxy's (allocsOf).
func TestProxiedRequestAllocatesNothing(t *testing.T) {
	replicas := []string{fastReplica(t), fastReplica(t)}
	for _, cfg := range []struct {
		name string
		cfg  Config
	}{
		// Waits are relayed past main's -relay-waiting-above alone.
		{"adaptive", Config{Policy: Adaptive, RelayWaitingAbove: -1}},
		{"cost", Config{Policy: Cost, RelayWaitingAbove: -1}},
		// The same request again (its newest link pinned here) asks the
		// store nothing.
		{"rendezvous and a pin store", Config{Policy: Adaptive, Rendezvous: true, PinStore: openStore(t), RelayWaitingAbove: -1}},
		// Every stream written by fasthttp's body stream, not relayed.
		{"no relay", Config{Policy: Adaptive, RelayAbove: -1, RelayWaitingAbove: -1}},
		// Every wait relayed, and the answer written by the relay.
		{"waits relayed", Config{Policy: Adaptive}},
	} {
		c := inmemoryProxyWith(t, cfg.cfg, replicas...)
		for _, path := range []string{"/v1/chat/completions", "/sse"} {
			req, resp := chatRequest(path), fasthttp.AcquireResponse()
			for i := 0; i < 200; i++ { // warm the pools and the connections
				doChat(t, c, req, resp)
			}
			if n, want := testing.AllocsPerRun(500, func() { doChat(t, c, req, resp) }), allocsOf(path, cfg.cfg); n != want {
				t.Errorf("%s, %s: %.1f allocations per proxied request, want %.0f", cfg.name, path, n, want)
			}
		}
	}
}

// A wait polls its client every poll interval: with thousands of long
// prefills waiting, the poll must leave no garbage.
func TestPeerClosedAllocatesNothing(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the proxy peeks at its client's socket on Linux only")
	}
	c, _ := acceptedPair(t)
	for _, nc := range []net.Conn{c, &pipelinedConn{Conn: c}} {
		if n := testing.AllocsPerRun(100, func() {
			if upstream.PeerClosed(nc) {
				t.Fatal("PeerClosed of a client that is there")
			}
		}); n != 0 {
			t.Errorf("PeerClosed(%T) allocates %.1f times, want 0", nc, n)
		}
	}
}
