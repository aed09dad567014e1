package router

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// streamState is an exchange's relay of a response body that is not read
// whole: SSE, chunked, or large (exchange.Read).
type streamState struct {
	body    *upstream.Body
	done    bool      // the body ended whole
	written time.Time // when the client's write deadline was last moved
	sent    int64     // body bytes relayed, for the access log
	idSeen  bool      // a Responses stream's id was recorded
	// checkEnd is set for an SSE stream of a known API that ends when the
	// replica closes: it must send one of the exchange's ends (whole.go),
	// and ended records that it did.
	checkEnd, ended bool
	tailed          int64 // bytes written to the exchange's tail (keepTail)
	result          upstream.Result
	err             error
}

// errStreamCut is what the client's connection is closed with when the
// replica's stream broke.
var errStreamCut = errors.New("replica stream cut")

// contain turns a panic in Read into a cut stream, logged with its stack
// as survive logs one in Serve: fasthttp, which calls Read after Serve
// returned, would recover it and log it at DEBUG alone. The replica's
// connection is closed (finish), and the proxy serves on.
func (x *exchange) contain(err *error) {
	v := recover()
	if v == nil {
		return
	}
	x.h.log.Error("panic relaying a stream; it is cut", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	x.stream.result, x.stream.err = upstream.MaybeRunning, errStreamCut
	*err = errStreamCut
}

func (x *exchange) cut(e *upstream.Error) error {
	s := &x.stream
	s.result = e.Result()
	switch {
	case s.result == upstream.ClientGone:
		s.err = upstream.ErrClientGone
	case x.h.cutting.Load():
		s.err = errStreamCut
		x.h.log.Debug("stream cut by the drain's deadline", "replica", x.r.Name, "cause", e.Error())
	default:
		s.err = errStreamCut
		if ok, held := x.r.CutLog.Allow(time.Now()); ok {
			x.h.log.Warn("replica stream cut; the client sees a truncated stream", "replica", x.r.Name, "cause", e.Error(), "suppressed", held)
		}
	}
	return s.err
}
