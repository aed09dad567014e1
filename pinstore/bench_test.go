package pinstore

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/redistest"
)

// The benchmarks run against a real redis-server on loopback, as the tests
// do. The numbers in the package doc come from
// `go test -run '^$' -bench . -benchmem ./pinstore/`.

func benchStore(b *testing.B, r *redistest.Server, opt Options) *Store {
	b.Helper()
	s, _ := open(b, r, opt)
	waitUp(b, s)
	return s
}

// checkNoErrors fails a benchmark whose reads did not all reach Redis: its
// number would be the skip path's, not the round trip's.
func checkNoErrors(b *testing.B, s *Store) {
	b.Helper()
	if st := s.Stats(); st.Errors != 0 || st.Skipped != 0 {
		b.Fatalf("reads failed or were skipped: %+v", st)
	}
}

// BenchmarkGetMiss is the latency that a local miss adds to a request: a key
// that Redis does not hold and the client-side cache has not seen, one round
// trip (CLIENT CACHING YES, MULTI, PTTL, GET, EXEC in one pipeline).
func BenchmarkGetMiss(b *testing.B) {
	r := redistest.Start(b)
	s := benchStore(b, r, Options{Timeout: testTimeout, CacheBytes: 64 << 20})
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, ok := s.Get(link(i)); ok {
			b.Fatal("a pin in an empty Redis")
		}
	}
	b.StopTimer()
	checkNoErrors(b, s)
}

// BenchmarkGetMissParallel is BenchmarkGetMiss from many goroutines: their
// reads share round trips through rueidis's pipelining.
func BenchmarkGetMissParallel(b *testing.B) {
	r := redistest.Start(b)
	s := benchStore(b, r, Options{Timeout: testTimeout, CacheBytes: 64 << 20})
	b.ReportAllocs()
	b.SetParallelism(8)
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := s.Get(link(int(next.Add(1)))); ok {
				b.Error("a pin in an empty Redis")
				return
			}
		}
	})
	b.StopTimer()
	checkNoErrors(b, s)
}

// BenchmarkGetHit reads a pin that an earlier read brought into the
// client-side cache: no round trip.
func BenchmarkGetHit(b *testing.B) {
	r := redistest.Start(b)
	s := benchStore(b, r, Options{Timeout: testTimeout})
	s.Put(link(1), "10.0.0.5:8000")
	eventually(b, 5*time.Second, "pin written", func() bool { _, ok := s.Get(link(1)); return ok })
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := s.Get(link(1)); !ok {
			b.Fatal("pin lost")
		}
	}
	b.StopTimer()
	if st := s.Stats(); st.CacheHits < uint64(b.N) {
		b.Fatalf("reads not served by the client-side cache: %+v", st)
	}
}

// BenchmarkGetSkipped is a read while the store is down: what a request pays
// during an outage.
func BenchmarkGetSkipped(b *testing.B) {
	r := redistest.New(b)
	s, _ := open(b, r, Options{}) // nothing listens: the store stays down
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := s.Get(link(1)); ok {
			b.Fatal("a read without Redis")
		}
	}
}

// BenchmarkPut is what Put costs its caller: a send on the queue. The
// writer drains it into Redis at the same time; a pin that finds the queue
// full is dropped (reported as dropped/op).
func BenchmarkPut(b *testing.B) {
	r := redistest.Start(b)
	s := benchStore(b, r, Options{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s.Put(link(i), "10.0.0.5:8000")
	}
	b.StopTimer()
	b.ReportMetric(float64(s.Stats().Dropped)/float64(b.N), "dropped/op")
}

// BenchmarkWriteThroughput is the writer's pace: pins written to Redis a
// second when Puts arrive faster than it drains them.
func BenchmarkWriteThroughput(b *testing.B) {
	r := redistest.Start(b)
	s := benchStore(b, r, Options{QueueSize: 1 << 16})
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		for {
			st := s.Stats()
			if uint64(i)-st.Writes < 1<<15 { // keep the queue half full at most: no drops
				break
			}
			time.Sleep(100 * time.Microsecond) // poll interval
		}
		s.Put(link(i), "10.0.0.5:8000")
	}
	eventually(b, 30*time.Second, "all written", func() bool { return s.Stats().Writes == uint64(b.N) })
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pins/s")
}
