package router

import (
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// exchange is one request's way through the proxy: the request and its
// chain, the replica and connection it is on, why it went there, and since
// when. It is pooled. When the answer is streamed it is also the body
// stream that fasthttp reads (stream.go), and it goes back to the pool when
// fasthttp closes that stream.
type exchange struct {
	h     *Handler
	ctx   *fasthttp.RequestCtx
	body  []byte
	start time.Time
	req   Request
	chain []prefixcache.Link // req.Chain's storage, in sc
	head  []byte             // the request head for the replica, in sc

	r      *upstream.Replica
	c      *upstream.Conn // nil unless a connection is held
	reason Reason
	top    int // the request's rendezvous placement (Decision.Top)
	status int
	tried  upstream.Mask // the replicas that had this request, or failed to take it
	sends  int
	resend bool   // a send was tried before this one
	model  uint64 // the key of the body's model, 0 for none
	// responses marks a Responses API request: the answer's id is
	// recorded (responses.go).
	responses bool
	// prevResponse is the previous_response_id that the request follows
	// to the one replica holding it (body bytes), nil for none.
	prevResponse []byte
	serves       upstream.Mask // the replicas that serve the model
	// firstByte is when the answer's first byte came (the access log).
	firstByte time.Time
	// work is the prefill that the policy expects the request to cost on
	// its replica (the bytes of its prompt not cached there), queued on
	// the replica until the first byte (Replica.Queue).
	work   int64
	queued bool // work is counted on the replica's queue
	// predictedCached is the prompt tokens that the policy expected the
	// replica's cache to hold, checked against what the replica reports
	// (usage.go); -1 when the policy made no prediction.
	predictedCached int32

	stream streamState
	// client is the client's connection while a stream is relayed: the
	// request's ctx is fasthttp's again once the relay took the
	// connection over (relay.go).
	client net.Conn
	// relayed marks a stream that the relay writes itself, x.ctx no
	// longer its own.
	relayed bool
	// pipelined holds what the client sent after the streamed request,
	// read out of fasthttp's buffer, served after the stream.
	pipelined []byte

	// early marks a request whose first byte a relay awaits (relay.go):
	// the relay writes whatever answer comes, and sends the request
	// again, from x.body and x.head, if it must.
	early bool
	// waiting marks x counted in Handler.waiting.
	waiting bool
	// staleResent marks a send again on a fresh connection, after a
	// stale keep-alive one (run).
	staleResent bool
	// bodyHeld marks a body that the budget holds (dropBody), which a
	// relay does not keep for a second send.
	bodyHeld bool
	// headRequest is the client's request a HEAD, kept for a relay.
	headRequest bool
	// park is the state of a relay's wait parked on the poller (park.go):
	// when the stream's wait for its next byte began (zero when none
	// does), the answer's head read (a relay resumed past awaitAnswer),
	// and whether the poller woke it for the wait's end, not for a byte.
	park struct {
		start time.Time
		head  bool
		due   bool
	}
	// sent is when the request that a relay awaits was sent.
	sent time.Time
	// hostAt and hostLen are where the Host header's value is in head
	// (set by waitOnRelay), so that a relay with no ctx can send it to
	// another replica.
	hostAt, hostLen int
	// spare holds, while a relay keeps the request's body, the buffer
	// that the body goes back into (giveBodyBack).
	spare *keptBody
	// answer is an answer that a relay writes whole (writeAnswer), its
	// head in relayHeader: a replica's read whole, a bodiless one, the
	// proxy's own error (writeError), or none with the connection closed.
	answer struct {
		body    []byte
		ready   bool
		close   bool
		started bool // the relay wrote to the client
	}

	kept
}

// kept is what an exchange keeps across uses, made once and not cleared
// by releaseExchange.
type kept struct {
	sc *scratch // chain's and head's storage, unless a stream gave it back
	// tail holds the last bytes that a stream relayed, where its usage is
	// (usage.go); usageWindow bytes.
	tail []byte
	// modelName is the body's model as written, copied for the access
	// log: a streamed answer outlives its body, which goes to the next
	// large request (dropBody).
	modelName []byte
	// relayHeader holds the answer's head of a request that a relay
	// awaited, and then a relayed stream's trailers (trailers).
	relayHeader *fasthttp.ResponseHeader
	// hijack is x.hijacked, bound once for the pooled x (relayStream):
	// fasthttp's Hijack takes a func, which a method value made per
	// request would allocate.
	hijack func(net.Conn)
	// logMethod and logPath are the request's, copied for the access log
	// of a relayed stream.
	logMethod, logPath []byte
}

// loadsPool holds the load tables (10 KiB) of the policies that read load
// (req.Load), taken for a pick alone (pick): only the available replicas'
// rows are written.
var loadsPool = sync.Pool{New: func() any { return new(Loads) }}

var exchangePool = sync.Pool{New: func() any { return &exchange{kept: kept{tail: make([]byte, usageWindow)}} }}

// scratch holds the buffers of an exchange that a relayed stream needs no
// more once its pin is made and its head written: the chain and the head
// (the request's for the replica, then the answer's for the client). The
// stream gives them back (dropScratch) rather than hold them while open.
//
// A new scratch is small, room for a chat of a few messages and a short
// head: in a burst every request that waits holds its own until its answer
// comes, and what the burst allocated stays resident after it
// (scripts/streams.sh). They grow with the requests that need more, and
// keep what they grew to in the pool, so that a busy proxy allocates none.
type scratch struct {
	chain []prefixcache.Link
	head  []byte
}

var scratchPool = sync.Pool{New: func() any {
	return &scratch{chain: make([]prefixcache.Link, 0, 16), head: make([]byte, 0, 512)}
}}

// dropScratch gives x's scratch back to its pool.
func (x *exchange) dropScratch() {
	x.sc.chain, x.sc.head = x.chain[:0], x.head[:0]
	scratchPool.Put(x.sc)
	x.sc, x.chain, x.head, x.req.Chain = nil, nil, nil, nil
}

// clock reads the clock for x: x.start plus the monotonic time since, one
// clock read where time.Now makes two (wall and monotonic); a request reads
// it three times.
func (x *exchange) clock() time.Time { return x.start.Add(time.Since(x.start)) }

func acquireExchange(h *Handler, ctx *fasthttp.RequestCtx, start time.Time) *exchange {
	x := exchangePool.Get().(*exchange)
	x.h, x.ctx, x.body, x.start, x.client = h, ctx, ctx.PostBody(), start, ctx.Conn()
	x.predictedCached = -1
	if x.sc == nil {
		x.sc = scratchPool.Get().(*scratch)
	}
	x.chain, x.head = x.sc.chain[:0], x.sc.head[:0]
	return x
}

// releaseExchange returns x to the pool; it must hold no connection.
func releaseExchange(x *exchange) {
	if x.sc != nil {
		x.sc.chain, x.sc.head = x.chain[:0], x.head[:0] // as they grew
	}
	if x.relayHeader != nil {
		x.relayHeader.Reset() // none reach the next stream's client
	}
	x.giveBodyBack()
	*x = exchange{kept: x.kept, predictedCached: -1}
	exchangePool.Put(x)
}
