//go:build unix

package pinstore

import (
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/redistest"
)

// TestRedisHungReadIsBounded: Redis stopped with SIGSTOP keeps its
// connections open and answers nothing, the case where only the read budget
// protects a request. A read returns within the budget (plus scheduling
// slack), the next ones are skipped, writes never block, and Redis's return
// brings the store back up.
func TestRedisHungReadIsBounded(t *testing.T) {
	r := redistest.Start(t)
	const budget = 20 * time.Millisecond
	s, lb := open(t, r, Options{Timeout: budget, QueueSize: 64, WriteTimeout: 200 * time.Millisecond})
	waitUp(t, s)
	s.Put(link(1), "10.0.0.1:8000")
	eventually(t, 5*time.Second, "pin written", func() bool { return s.Stats().Writes == 1 })

	r.Signal(syscall.SIGSTOP)
	t0 := time.Now()
	if _, ok := s.Get(link(2)); ok {
		t.Fatal("a read succeeded from a stopped Redis")
	}
	took := time.Since(t0)
	t.Logf("a read from a hung Redis returned after %v (budget %v)", took, budget)
	if took > budget+200*time.Millisecond {
		t.Errorf("a read from a hung Redis took %v, budget %v", took, budget)
	}
	// One slow read is not an outage; slowReadsDown in a row are.
	if st := s.Stats(); st.Timeouts != 1 || !st.Up {
		t.Errorf("after one timed out read: %+v", st)
	}
	for i := 1; i < slowReadsDown; i++ {
		s.Get(link(3 + i))
	}
	if st := s.Stats(); st.Timeouts != slowReadsDown || st.Up {
		t.Errorf("after %d timed out reads: %+v", slowReadsDown, st)
	}
	t0 = time.Now()
	for i := range 10000 {
		s.Put(link(10+i), "10.0.0.2:8000")
		if _, ok := s.Get(link(10 + i)); ok {
			t.Fatal("a read succeeded from a stopped Redis")
		}
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("10000 Put+Get took %v against a hung Redis", d)
	}
	if st := s.Stats(); st.ReadErrors != slowReadsDown || st.Dropped == 0 {
		t.Errorf("reads should be skipped and writes dropped while down: %+v", st)
	}
	r.Signal(syscall.SIGCONT)
	waitUp(t, s)
	s.Put(link(20000), "10.0.0.4:8000")
	eventually(t, 5*time.Second, "pin after Redis resumed", func() bool {
		v, ok := s.Get(link(20000))
		return ok && v == "10.0.0.4:8000"
	})
	if n := lb.count("pin store unreachable"); n != 1 {
		t.Errorf("outage logged %d times:\n%s", n, lb)
	}
}
