package router

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

// An OpenAI-style error body for each way the proxy itself answers, made
// once: clients parse error.message, and Go's error text never leaks out.
var (
	errBodyBadGateway   = errorBody("the replica failed before it answered; the request was not retried because the replica may have run it", "upstream_error", 502)
	errBodyTimeout      = errorBody("the replica did not answer within the proxy's timeout; the request was not retried because the replica may have run it", "upstream_timeout", 504)
	errBodyHung         = errorBody("the replica stopped answering and was taken out of rotation; the request was not retried because the replica may have run it", "upstream_timeout", 504)
	errBodyUnavailable  = errorBody("no live replica: every replica is down or could not be reached", "no_replica", 503)
	errBodyTooLarge     = errorBody("the request body is larger than the proxy's -max-body-size", "request_too_large", 413)
	errBodyBadRequest   = errorBody("the request could not be parsed as HTTP", "invalid_request_error", 400)
	errBodyInternal     = errorBody("the proxy failed on this request; it is logged", "internal_error", 500)
	errBodyProxyTimeout = errorBody("the request was not received in time", "request_timeout", 408)
	errBodyUnauthorized = errorBody("a valid API key is required: Authorization: Bearer KEY, or X-Api-Key: KEY", "invalid_api_key", 401)
	errBodyOverBudget   = errorBody("the proxy holds as many request bodies as its -max-body-memory allows; retry shortly", "overloaded", 503)
	errBodyVersion      = errorBody("the HTTP version is not supported; use HTTP/1.1", "http_version_not_supported", 505)
	errBodyConnect      = errorBody("CONNECT is not supported: warmroute is a reverse proxy for its replicas, not a forward proxy", "method_not_allowed", 405)
	errBodyBadTarget    = errorBody("the request target must be a path such as /v1/chat/completions", "invalid_request_error", 400)
	errBodyBadPath      = errorBody("the request path may not hold a dot segment (/./, /../) or an encoded slash or dot (%2F, %2E)", "invalid_request_error", 400)
	errBodyNotForwarded = errorBody("warmroute forwards only the inference API to its replicas; this path is not one of them: name it with -forward-path to forward it", "not_found_error", 404)
	errBodyBareLF       = errorBody("every line of the request head must end in CRLF; a bare LF is not accepted", "invalid_request_error", 400)
	errBodyBadHeader    = errorBody("a header name is not a valid HTTP token", "invalid_request_error", 400)
)

func goneResponseBody(id []byte) []byte {
	return errorBody("previous_response_id "+string(id)+" was stored on a replica that is down or gone; send the conversation again without it", "invalid_request_error", 404)
}

func errorBody(msg, typ string, code int) []byte {
	return []byte(`{"error":{"message":` + strconv.Quote(msg) + `,"type":"` + typ + `","param":null,"code":` + strconv.Itoa(code) + `}}`)
}

var strApplicationJSON = []byte("application/json")

func writeError(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.Response.Reset()
	ctx.Response.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(strApplicationJSON)
	ctx.Response.SetBodyRaw(body)
}

// ErrorHandler answers requests that fasthttp could not read: 413 for a
// body over the limit, 408 for a client too slow to send it, 400 otherwise.
// The proxy stays up and the connection is closed.
func ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case err == fasthttp.ErrBodyTooLarge:
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, errBodyTooLarge)
	case isTimeout(err):
		writeError(ctx, fasthttp.StatusRequestTimeout, errBodyProxyTimeout)
	case errors.Is(err, errBareLF):
		writeError(ctx, fasthttp.StatusBadRequest, errBodyBareLF)
	default:
		writeError(ctx, fasthttp.StatusBadRequest, errBodyBadRequest)
	}
	ctx.SetConnectionClose()
}

func isTimeout(err error) bool {
	t, ok := err.(interface{ Timeout() bool })
	return ok && t.Timeout()
}

// answerOwn answers x with the proxy's own error: no replica took it.
func (x *exchange) answerOwn(status int, body []byte) {
	writeError(x.ctx, status, body)
	x.ctx.Response.Header.SetCanonical(headerReplica, replicaNone)
	x.ctx.Response.Header.SetCanonical(headerRoute, reasonBytes[NoReplica])
	x.reason = NoReplica
	x.record(-1, classOf(status), status, int64(len(body)), "none", time.Now())
}

// fail answers a request that its replica may have run but did not answer:
// 502 or 504 with a JSON error, or 499 for a client that left.
func (h *Handler) fail(x *exchange, v upstream.Verdict, err *upstream.Error) {
	idx := x.r.Index
	x.verdict = v.Result.String()
	if v.Result == upstream.ClientGone {
		// Nobody is there to read an answer.
		x.ctx.Response.Reset()
		x.ctx.SetStatusCode(499)
		x.ctx.SetConnectionClose()
		x.record(idx, classClientGone, 499, 0, x.r.Name, time.Now())
		return
	}
	if ok, held := x.r.FailLog.Allow(time.Now()); ok && !h.cutting.Load() {
		h.log.Warn("replica failed after it had the request; not retried", "replica", x.r.Name,
			"cause", err.Error(), "phase", err.Phase.String(), "status", v.Status, "suppressed", held)
	}
	body := errBodyBadGateway
	if v.Status == fasthttp.StatusGatewayTimeout {
		body = errBodyTimeout
		if err.Sign == upstream.SignHung {
			body = errBodyHung
		}
	}
	writeError(x.ctx, v.Status, body)
	x.ctx.Response.Header.SetCanonical(headerReplica, x.r.NameBytes)
	x.ctx.Response.Header.SetCanonical(headerRoute, reasonBytes[x.reason])
	x.record(idx, classOf(v.Status), v.Status, int64(len(body)), x.r.Name, time.Now())
}

// unavailable answers 503 at once when no replica is live: a request never
// queues behind replicas that may not come back.
func (h *Handler) unavailable(x *exchange) {
	if x.prevResponse != nil {
		// No other replica holds the response it follows.
		x.answerOwn(fasthttp.StatusNotFound, goneResponseBody(x.prevResponse))
		return
	}
	x.answerOwn(fasthttp.StatusServiceUnavailable, errBodyUnavailable)
	secs := min(h.set.RetryAfter(x.start), len(retryAfterSeconds)-1)
	x.ctx.Response.Header.SetCanonical(strRetryAfter, retryAfterSeconds[secs])
}

// survive keeps a bug in one request from taking every other request and
// stream down with the process, as net/http does for its handlers: it logs
// the panic with its stack, closes the replica connection that x held (so
// that the in-flight count comes back), answers 500 if it still can, and
// closes the client's connection. x is not pooled again.
func (h *Handler) survive(x *exchange) {
	v := recover()
	if v == nil {
		return
	}
	h.log.Error("panic serving a request; the connection is closed", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	x.lease.End(false, time.Time{})
	writeError(x.ctx, fasthttp.StatusInternalServerError, errBodyInternal)
	x.ctx.SetConnectionClose()
}
