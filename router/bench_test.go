package router

import (
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/prefixcache"
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
		chain := make([]prefixcache.Link, 0, 64)
		for pb.Next() {
			chain, _ = appendChain(chain[:0], body)
			r, _ := Pick(Adaptive, Request{Chain: chain, Avail: upstream.Mask{0b1111}}, pins, &counter)
			sinkReplica.Store(int64(r))
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
