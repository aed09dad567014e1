package router

import (
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
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
	errBodyOverBudget   = errorBody("the proxy holds as many request bodies as its -max-body-bytes allows; retry shortly", "overloaded", 503)
	errBodyVersion      = errorBody("the HTTP version is not supported; use HTTP/1.1", "http_version_not_supported", 505)
	errBodyConnect      = errorBody("CONNECT is not supported: warmroute is a reverse proxy for its replicas, not a forward proxy", "method_not_allowed", 405)
	errBodyBadTarget    = errorBody("the request target must be a path such as /v1/chat/completions", "invalid_request_error", 400)
	errBodyBadPath      = errorBody("the request path may not hold a dot segment (/./, /../) or an encoded slash or dot (%2F, %2E)", "invalid_request_error", 400)
	errBodyNotForwarded = errorBody("warmroute forwards only the inference API to its replicas; this path is not one of them: name it with -forward-path to forward it", "not_found_error", 404)
	errBodyBareLF       = errorBody("every line of the request head must end in CRLF; a bare LF is not accepted", "invalid_request_error", 400)
	errBodyBadHeader    = errorBody("a header name is not a valid HTTP token", "invalid_request_error", 400)
)

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
