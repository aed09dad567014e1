package router

import (
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

	r      *upstream.Replica
	c      *upstream.Conn // nil unless a connection is held
	reason Reason
	top    int // the request's rendezvous placement (Decision.Top)
	status int
	tried  upstream.Mask // the replicas that had this request, or failed to take it
	sends  int
	// fresh marks a send again on a fresh connection to the same replica,
	// after a stale keep-alive one (upstream.Fresh).
	fresh bool
	// failed is the replica of the last send that failed before it had
	// the request, and failErr its error: the next pick is a failover.
	failed  *upstream.Replica
	failErr *upstream.Error
	model   uint64 // the key of the body's model, 0 for none
	// responses marks a Responses API request: the answer's id is
	// recorded (responses.go).
	responses bool
	// ends are the events that end a stream of the request's API, one of
	// which a stream ended by the replica's close must have sent
	// (whole.go); nil for an API not known.
	ends [][]byte
	// prevResponse is the previous_response_id that the request follows
	// to the one replica holding it (body bytes), nil for none.
	prevResponse []byte
	serves       upstream.Mask // the replicas that serve the model
	// firstByte is when the answer's head came (the access log).
	firstByte time.Time
	// work is the prefill that the policy expects the request to cost on
	// its replica (the bytes of its prompt not cached there), queued on
	// the replica until the first byte (Replica.Queue).
	work     int64
	queued   bool              // work is counted on queuedOn's queue
	queuedOn *upstream.Replica // the replica picked, x.r once sent
	// predictedCached is the prompt tokens that the policy expected the
	// replica's cache to hold, checked against what the replica reports
	// (usage.go); -1 when the policy made no prediction.
	predictedCached int32
	// What the replica was believed to hold of the prompt when it was
	// sent (held.go): its bytes, its links, and the stamp of its oldest
	// link (0: no correction possible); heldTick is the stamp that the
	// send recorded, 0 for none.
	heldBytes           int64
	heldFrom            int
	heldStamp, heldTick uint64

	stream streamState

	kept
}

// kept is what an exchange keeps across uses: buffers that grow to what
// the requests need and stay grown in the pool, so that a busy proxy
// allocates none.
type kept struct {
	chains prefixcache.Chains // req.Chain's and req.Blocks' storage
	head   []byte             // the request head for the replica
	// tail holds the last bytes that a stream relayed, where its usage is
	// (usage.go); usageWindow bytes.
	tail []byte
	// modelName is the body's model as written, copied for the access
	// log: a streamed answer outlives its body, which goes to the next
	// large request (dropBody).
	modelName []byte
}

var exchangePool = sync.Pool{New: func() any {
	return &exchange{kept: kept{tail: make([]byte, usageWindow), head: make([]byte, 0, 512)}}
}}

// clock reads the clock for x: x.start plus the monotonic time since, one
// clock read where time.Now makes two (wall and monotonic).
func (x *exchange) clock() time.Time { return x.start.Add(time.Since(x.start)) }

func acquireExchange(h *Handler, ctx *fasthttp.RequestCtx, start time.Time) *exchange {
	x := exchangePool.Get().(*exchange)
	x.h, x.ctx, x.body, x.start = h, ctx, ctx.PostBody(), start
	x.predictedCached = -1
	return x
}

// releaseExchange returns x to the pool; it must hold no connection.
func releaseExchange(x *exchange) {
	k := x.kept
	k.head = k.head[:0]
	*x = exchange{kept: k}
	exchangePool.Put(x)
}

// loadsPool holds the load tables of the policies that read load
// (req.Load), taken for a pick alone (pick): only the available replicas'
// rows are written.
var loadsPool = sync.Pool{New: func() any { return new(Loads) }}
