package router

import (
	"sync"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// spareBodies keeps the buffers of large request bodies (over
// budgetInline) that are done with, so that the next large body is read
// into one of them instead of a fresh allocation that the runtime must
// clear and later collect: for 360 KB prompts back to back, a quarter of
// the proxy's CPU a request (scripts/peers.sh chat-90k). It holds at most
// max bytes, and is emptied when a burst of large bodies is over
// (bodyBudget.giveBack), so that their memory still goes back to the
// system.
type spareBodies struct {
	mu    sync.Mutex
	bufs  [][]byte
	bytes int64
	max   int64
}

// maxSpareBody is the largest buffer kept: rarer, larger bodies are
// allocated each time.
const maxSpareBody = 16 << 20

// get returns the smallest kept buffer that holds n bytes, emptied, or
// nil. It is at most twice n: the budget counts n, and a small body must
// not hold a far larger buffer that it does not count.
func (s *spareBodies) get(n int64) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	best := -1
	for i, b := range s.bufs {
		if c := int64(cap(b)); c >= n && c <= 2*n && (best < 0 || c < int64(cap(s.bufs[best]))) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := s.bufs[best]
	last := len(s.bufs) - 1
	s.bufs[best] = s.bufs[last]
	s.bufs[last] = nil
	s.bufs = s.bufs[:last]
	s.bytes -= int64(cap(b))
	return b[:0]
}

// put keeps b for a later large body if it is large, and small enough,
// and fits.
func (s *spareBodies) put(b []byte) {
	c := int64(cap(b))
	if c <= budgetInline || c > maxSpareBody {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bytes+c > s.max {
		return
	}
	s.bufs = append(s.bufs, b[:0])
	s.bytes += c
}

// drop forgets every kept buffer, for the collector to take.
func (s *spareBodies) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.bufs)
	s.bufs = s.bufs[:0]
	s.bytes = 0
}

// held returns the bytes kept.
func (s *spareBodies) held() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// headerOffset is where a Request's Header lies in it.
var headerOffset = unsafe.Offsetof(fasthttp.Request{}.Header)

// requestOf returns the request whose head hd is. fasthttp's server calls
// HeaderReceived with &ctx.Request.Header, and no other way to the request
// exists before its body is read; only the server's hook may call it.
func requestOf(hd *fasthttp.RequestHeader) *fasthttp.Request {
	return (*fasthttp.Request)(unsafe.Add(unsafe.Pointer(hd), -int(headerOffset)))
}
