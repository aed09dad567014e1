package router

import (
	"bytes"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// budgetInline is the largest request body that the budget does not count:
// a small chat request costs less than the bookkeeping, and such bodies are
// bounded by the connections, like the read buffers.
const budgetInline = 64 << 10

// bodyBudget bounds the request bodies held in memory at once, summed over
// all requests: -max-body-size bounds one, this bounds them all. A request
// reserves its Content-Length when its head arrives (fasthttp's
// HeaderReceived, before the body is read); past the budget it is answered
// 503 with Retry-After and its body is never read. The reservation is
// claimed by the handler and released when the handler is done with the
// body; one whose body never arrived (the client left mid-body, a read
// timeout) is released once the client read timeout has passed, so that no
// failure path leaks budget for good.
type bodyBudget struct {
	limit   int64
	maxBody int64
	expiry  time.Duration // the client read timeout

	used      atomic.Int64 // bytes reserved
	pending   atomic.Int64 // reservations not yet claimed by the handler
	over      atomic.Uint64
	nextSweep atomic.Int64 // unix nanoseconds of the next expire

	mu   sync.Mutex
	held map[*fasthttp.RequestHeader]reservation

	idle chan struct{} // the last large body was released: give memory back
}

type reservation struct {
	n        int64
	deadline int64 // unix nanoseconds after which an unclaimed one is released
	refused  bool  // no bytes: the request was over the budget
}

func newBodyBudget(limit, maxBody int64, expiry time.Duration) *bodyBudget {
	b := &bodyBudget{limit: limit, maxBody: maxBody, expiry: expiry, held: map[*fasthttp.RequestHeader]reservation{}, idle: make(chan struct{}, 1)}
	go b.giveBack()
	return b
}

// giveBack returns the memory of large bodies to the system once a burst
// of them is over, at most every giveBackEvery. Their buffers are not
// kept in fasthttp's pool (dropBody), but an idle proxy allocates nothing,
// so the runtime would collect them only at its two-minute forced
// collection and return the pages later still: a proxy that held a
// gigabyte of prompts would keep it resident for minutes.
func (b *bodyBudget) giveBack() {
	for range b.idle {
		if b.used.Load() == 0 {
			debug.FreeOSMemory()
		}
		time.Sleep(giveBackEvery)
	}
}

const giveBackEvery = 5 * time.Second

// size is what a request with this head reserves: its Content-Length, or
// the most a chunked body may be.
func (b *bodyBudget) size(hd *fasthttp.RequestHeader) int64 {
	n := int64(hd.ContentLength())
	if n == -1 {
		n = b.maxBody
	}
	if n <= budgetInline || n > b.maxBody {
		return 0 // not counted, or refused by the size limit anyway
	}
	return n
}

// reserve takes n bytes for the request whose head is hd, and reports
// whether they fit. A refusal is recorded too, for errorHandler to find.
func (b *bodyBudget) reserve(hd *fasthttp.RequestHeader, n int64) bool {
	now := time.Now()
	if next := b.nextSweep.Load(); now.UnixNano() > next && b.nextSweep.CompareAndSwap(next, now.Add(time.Second).UnixNano()) {
		b.expire(now)
	}
	r := reservation{n: n, deadline: now.UnixNano() + int64(b.expiry)}
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		b.over.Add(1)
		r = reservation{deadline: r.deadline, refused: true}
	}
	b.mu.Lock()
	if old, ok := b.held[hd]; ok {
		// The same request context on a new request: the last one never
		// reached the handler (its connection died mid-body).
		b.used.Add(-old.n)
		b.pending.Add(-1)
	}
	b.held[hd] = r
	b.mu.Unlock()
	b.pending.Add(1)
	return !r.refused
}

// headerReceived is the server's HeaderReceived hook: a request over the
// budget is given a body limit that its body cannot meet, so that fasthttp
// refuses it before reading it, and errorHandler answers 503.
func (b *bodyBudget) headerReceived(hd *fasthttp.RequestHeader) fasthttp.RequestConfig {
	n := b.size(hd)
	if n == 0 || mayContinue(hd) {
		return fasthttp.RequestConfig{}
	}
	if !b.reserve(hd, n) {
		return fasthttp.RequestConfig{MaxRequestBodySize: budgetInline}
	}
	return fasthttp.RequestConfig{}
}

var (
	strExpect      = []byte("Expect")
	str100Continue = []byte("100-continue")
)

// mayContinue reports whether the request waits for 100 Continue before it
// sends its body: its reservation is made by Handler.expect then.
func mayContinue(hd *fasthttp.RequestHeader) bool {
	return hd.IsHTTP11() && bytes.EqualFold(hd.PeekBytes(strExpect), str100Continue)
}

// claim hands the reservation of hd's request, if any, to its caller, which
// releases it when done with the body; refused reports a request that was
// over the budget.
func (b *bodyBudget) claim(hd *fasthttp.RequestHeader) (n int64, refused bool) {
	if b.pending.Load() == 0 {
		return 0, false
	}
	b.mu.Lock()
	r, ok := b.held[hd]
	if ok {
		delete(b.held, hd)
	}
	b.mu.Unlock()
	if !ok {
		return 0, false
	}
	b.pending.Add(-1)
	return r.n, r.refused
}

// release gives n claimed bytes back.
func (b *bodyBudget) release(n int64) {
	if n > 0 && b.used.Add(-n) == 0 {
		select {
		case b.idle <- struct{}{}:
		default:
		}
	}
}

// expire releases the reservations of requests that never reached the
// handler within the client read timeout; reserve runs it at most once a
// second.
func (b *bodyBudget) expire(now time.Time) {
	if b.pending.Load() == 0 {
		return
	}
	t := now.UnixNano()
	b.mu.Lock()
	for hd, r := range b.held {
		if r.deadline < t {
			delete(b.held, hd)
			b.used.Add(-r.n)
			b.pending.Add(-1)
		}
	}
	b.mu.Unlock()
}
