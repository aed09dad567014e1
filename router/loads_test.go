//go:build !race

package router

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// Under the race detector sync.Pool drops a quarter of what is put back,
// so the count of tables made says nothing there.

// TestWaitingRequestsHoldNoLoadTable holds 40 requests at their replica
// under the cost policy, which reads the load table: a table is taken for
// the pick alone, so the requests that wait made a few, not one each
// (10 KiB a request in flight).
func TestWaitingRequestsHoldNoLoadTable(t *testing.T) {
	var made atomic.Int64
	was := loadsPool.New
	loadsPool.New = func() any { made.Add(1); return new(Loads) }
	t.Cleanup(func() { loadsPool.New = was })
	const n = 40
	arrived, release := make(chan struct{}, n), make(chan struct{})
	hold := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-release
		w.Write([]byte(`{"id":"x"}`))
	}
	a, b := startReplica(t, "a", hold), startReplica(t, "b", hold)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the replicas close, which waits for their handlers
	p := startProxy(t, Cost, []string{a.url(), b.url()})
	done := make(chan result, n)
	for i := range n {
		go func() { done <- post(p, "/v1/chat/completions", chat(i, 2)) }()
	}
	for range n {
		<-arrived
	}
	if m := made.Load(); m > n/4 {
		t.Errorf("%d load tables made for %d requests waiting at once; want a few, taken for the pick alone", m, n)
	}
	free()
	for range n {
		if r := <-done; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request: status %d, %v", r.status, r.err)
		}
	}
}
