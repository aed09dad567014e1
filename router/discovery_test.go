package router

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// Replicas found by DNS, from a DNS server on loopback, come and go under
// load: one that appears joins
// after its first good probe and gets requests, one that disappears gets no
// new request and its pins go, and no request fails meanwhile.
func TestDiscoveryUnderLoad(t *testing.T) {
	port, reps := loopbackTrio(t)
	dns := startDNS(t, "vllm.test", "127.0.0.2", "127.0.0.3")
	setAddrs := dns.set
	d := &upstream.Discovery{DNS: "vllm.test:" + port, Interval: 20 * time.Millisecond, Resolver: dns.resolver()}
	p := startProxyOn(t, Adaptive, func(c upstream.Config) (*upstream.Set, error) {
		c.HealthInterval = 50 * time.Millisecond
		return upstream.StartDiscovered(context.Background(), d, c)
	})
	p.set.Discover(p.ctx, d, nil)
	if n := len(p.set.Replicas()); n != 2 {
		t.Fatalf("%d replicas at start, want 2", n)
	}

	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := post(p, "/v1/chat/completions", chat(g*1000+i%5, 2+i%3))
				sent.Add(1)
				if r.err != nil || r.status != 200 {
					failed.Add(1)
					t.Errorf("client %d: %v %d %s", g, r.err, r.status, r.body)
				}
			}
		}(g)
	}
	gone := p.set.Replica(0)
	if gone == nil || gone.Name != reps[0].addr {
		t.Fatalf("slot 0 holds %v, want %s", gone, reps[0].addr)
	}
	waitFor(t, "pins on the first replica", func() bool { return p.h.Pins().Pins(0) > 0 })

	setAddrs("127.0.0.2", "127.0.0.3", "127.0.0.4") // a pod appears
	waitFor(t, "the new replica to serve", func() bool { return reps[2].requests.Load() > 20 })

	setAddrs("127.0.0.3", "127.0.0.4") // a pod goes
	waitFor(t, "the old replica to leave", func() bool { return gone.State() == upstream.Removed && p.set.Replica(0) != gone })
	before := reps[0].requests.Load()
	waitFor(t, "more requests after it left", func() bool { return reps[1].requests.Load()+reps[2].requests.Load() > sent.Load()/2 })
	close(stop)
	wg.Wait()
	if n := reps[0].requests.Load() - before; n != 0 {
		t.Errorf("the replica that left got %d requests after it was gone", n)
	}
	for i := 0; i < upstream.MaxReplicas; i++ {
		if r := p.set.Replica(i); r == nil && p.h.Pins().Pins(i) != 0 {
			t.Errorf("slot %d is free but holds %d pins", i, p.h.Pins().Pins(i))
		}
	}
	if p.h.Pins().Pins(0) != 0 && p.set.Replica(0) == nil {
		t.Error("the pins of the replica that left survived")
	}
	t.Logf("%d requests, %d failed; served: %d %d %d", sent.Load(), failed.Load(), reps[0].requests.Load(), reps[1].requests.Load(), reps[2].requests.Load())
	if p.logs.count(`"replica joined"`) != 1 {
		t.Errorf("join lines: %d, want 1", p.logs.count(`"replica joined"`))
	}
}
