package router

import (
	"bytes"
	"net"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/upstream"
)

// The front door's rules, applied before a request is routed: warmroute is
// a reverse proxy for a fixed set of replicas, so what a forward proxy
// would do with a request (CONNECT, a target on another host) is refused or
// undone, and what a replica could misread (an unknown HTTP version, a
// header name that is not a token) never reaches one.

var (
	strHTTP11Proto = []byte("HTTP/1.1")
	strHTTP10Proto = []byte("HTTP/1.0")
	strHTTPScheme  = []byte("http://")
	strHTTPSScheme = []byte("https://")
	strAsterisk    = []byte("*")
	strAllow       = []byte("Allow")
	allowedMethods = []byte("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
)

// admit applies the rules to ctx's request and reports whether it may be
// routed; when it may not, the answer is written: 505 for an HTTP version
// other than 1.0 and 1.1, 405 for CONNECT, 400 for a target that is neither
// a path nor an absolute http(s) URL, for a path with a dot segment or an
// encoded slash or dot, and for a header name that is not a token. An
// absolute-form target is rewritten to its path and query: its host is
// never forwarded.
func admit(ctx *fasthttp.RequestCtx) bool {
	hd := &ctx.Request.Header
	if p := hd.Protocol(); !bytes.Equal(p, strHTTP11Proto) && !bytes.Equal(p, strHTTP10Proto) {
		writeError(ctx, fasthttp.StatusHTTPVersionNotSupported, errBodyVersion)
		ctx.SetConnectionClose()
		return false
	}
	if hd.IsConnect() {
		writeError(ctx, fasthttp.StatusMethodNotAllowed, errBodyConnect)
		ctx.Response.Header.SetCanonical(strAllow, allowedMethods)
		return false
	}
	if uri := hd.RequestURI(); len(uri) == 0 || uri[0] != '/' {
		switch {
		case hasPrefixFold(uri, strHTTPScheme) || hasPrefixFold(uri, strHTTPSScheme):
			hd.SetRequestURIBytes(ctx.URI().RequestURI())
		case hd.IsOptions() && bytes.Equal(uri, strAsterisk):
		default:
			writeError(ctx, fasthttp.StatusBadRequest, errBodyBadTarget)
			ctx.SetConnectionClose()
			return false
		}
	}
	if !cleanPath(targetPath(hd.RequestURI())) {
		writeError(ctx, fasthttp.StatusBadRequest, errBodyBadPath)
		return false
	}
	for k := range hd.All() {
		if !upstream.IsToken(k) {
			writeError(ctx, fasthttp.StatusBadRequest, errBodyBadHeader)
			ctx.SetConnectionClose()
			return false
		}
	}
	return true
}

// targetPath is the path of a request target as the client wrote it and
// the replica gets it, without its query: fasthttp's Path is decoded and
// has its dot segments resolved, so it is not what is forwarded.
func targetPath(uri []byte) []byte {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		return uri[:i]
	}
	return uri
}

// cleanPath reports whether path has no dot segment ("/./", "/../", or one
// at its end) and no encoded slash or dot (%2F, %2E): a replica, or a
// server in front of it, that resolves them would serve another path than
// the one the allowlist read (/v1/../../health is /health).
func cleanPath(path []byte) bool {
	for i := 0; i < len(path); i++ {
		switch path[i] {
		case '%':
			if i+2 < len(path) && (path[i+1] == '2') && (path[i+2]|0x20 == 'f' || path[i+2]|0x20 == 'e') {
				return false
			}
		case '.':
			if i == 0 || path[i-1] != '/' {
				continue
			}
			end := i + 1
			if end < len(path) && path[end] == '.' {
				end++
			}
			if end == len(path) || path[end] == '/' {
				return false
			}
		}
	}
	return true
}

// forwards reports whether path (targetPath's) goes to the replicas: the
// inference API that vLLM, SGLang and llama.cpp serve and that OpenAI and
// Anthropic clients call, or a path that -forward-path names, matched
// whole. Everything else gets a 404, above all the engines'
// administrative endpoints that share a port with the API (vLLM's
// /reset_prefix_cache, /sleep, /collective_rpc, /v1/load_lora_adapter,
// /metrics; SGLang's /flush_cache; llama.cpp's /slots): anyone who can
// reach the proxy could call them on every replica. docs/security.md
// lists each path and why.
func (h *Handler) forwards(path []byte) bool {
	switch string(path) {
	case "/v1/chat/completions", "/chat/completions",
		"/v1/completions", "/completions", "/completion", "/infill",
		"/v1/responses",
		"/v1/messages", "/v1/messages/count_tokens",
		"/v1/embeddings", "/embeddings", "/embedding",
		"/v1/models", "/models",
		"/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize",
		"/rerank", "/v1/rerank", "/v2/rerank", "/reranking", "/v1/reranking",
		"/score", "/v1/score",
		"/v1/audio/transcriptions", "/v1/audio/translations", "/v1/audio/speech":
		return true
	}
	if id, ok := bytes.CutPrefix(path, strResponsesDir); ok {
		// A stored response: retrieve, delete, cancel, its input items.
		if i := bytes.IndexByte(id, '/'); i >= 0 {
			switch string(id[i:]) {
			case "/cancel", "/input_items":
				id = id[:i]
			}
		}
		return len(id) > 0 && bytes.IndexByte(id, '/') < 0
	}
	if id, ok := bytes.CutPrefix(path, strModelsDir); ok {
		return len(id) > 0 // a model by its id, which may hold a slash
	}
	for _, p := range h.cfg.ForwardPaths {
		if string(path) == p {
			return true
		}
	}
	return false
}

var (
	strResponsesDir = []byte("/v1/responses/")
	strModelsDir    = []byte("/v1/models/")
)

func hasPrefixFold(b, prefix []byte) bool {
	return len(b) >= len(prefix) && bytes.EqualFold(b[:len(prefix)], prefix)
}

// expect answers a request that asks for 100 Continue: one whose body is
// over the limit gets its 413, and one over the body budget its 503, at
// once, before the client sends the body.
func (h *Handler) expect(maxBody int) func(ctx *fasthttp.RequestCtx) int {
	return func(ctx *fasthttp.RequestCtx) int {
		hd := &ctx.Request.Header
		if maxBody > 0 && hd.ContentLength() > maxBody {
			writeError(ctx, fasthttp.StatusRequestEntityTooLarge, errBodyTooLarge)
			return fasthttp.StatusRequestEntityTooLarge
		}
		if b := h.budget; b != nil {
			if n := b.size(hd); n > 0 && !b.reserve(hd, n) {
				b.claim(hd) // the refusal is answered here
				h.overBudget(ctx)
				return fasthttp.StatusServiceUnavailable
			}
		}
		return fasthttp.StatusContinue
	}
}

// errorHandler answers requests that fasthttp could not read. One that it
// refused because the body budget was spent gets 503 with Retry-After; the
// rest are ErrorHandler's.
func (h *Handler) errorHandler(ctx *fasthttp.RequestCtx, err error) {
	if b := h.budget; b != nil {
		n, refused := b.claim(&ctx.Request.Header)
		b.release(n)
		if refused && err == fasthttp.ErrBodyTooLarge {
			h.overBudget(ctx)
			ctx.SetConnectionClose()
			drainRefused(ctx.Conn(), b.maxBody)
			return
		}
	}
	ErrorHandler(ctx, err)
}

// lingerTime bounds how long a refused body is read and dropped so that
// its client, still sending, sees the answer; lingerPause is how long the
// client may pause before it counts as done.
const (
	lingerTime  = 2 * time.Second
	lingerPause = 100 * time.Millisecond
)

// drainRefused reads and drops what the client still sends of a body
// refused before it was read, up to max bytes or lingerTime, until it
// pauses for lingerPause, before the answer is written and the connection
// closed: a connection closed with unread bytes is reset, which loses the
// answer on its way (nginx's lingering close). None of it is held in
// memory.
func drainRefused(c net.Conn, max int64) {
	var buf [4 << 10]byte
	end := time.Now().Add(lingerTime)
	for n := int64(0); n < max; {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		c.SetReadDeadline(now.Add(min(lingerPause, end.Sub(now))))
		m, err := c.Read(buf[:])
		n += int64(m)
		if err != nil {
			break
		}
	}
	c.SetReadDeadline(time.Time{})
}

// overBudget answers a request whose body the budget had no room for.
func (h *Handler) overBudget(ctx *fasthttp.RequestCtx) {
	writeError(ctx, fasthttp.StatusServiceUnavailable, errBodyOverBudget)
	ctx.Response.Header.SetCanonical(strRetryAfter, retryAfterSeconds[1])
}
