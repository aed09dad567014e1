package router

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"

	"github.com/valyala/fasthttp"
)

// API keys at the front door. A request carries one as
// "Authorization: Bearer KEY" (OpenAI clients) or "X-Api-Key: KEY"
// (Anthropic clients). Keys are kept as SHA-256 digests and compared in
// constant time, against every key, so that neither a key's bytes nor its
// length can be found by timing the answers.

var (
	strAuthorization   = []byte("Authorization")
	strXAPIKey         = []byte("X-Api-Key")
	strBearer          = []byte("Bearer ")
	strWWWAuthenticate = []byte("WWW-Authenticate")
	bearerRealm        = []byte(`Bearer realm="warmroute"`)
)

// SetKeys sets the API keys that requests must carry one of; none turns
// the check off. It is safe to call while requests are served (SIGHUP).
func (h *Handler) SetKeys(keys [][]byte) {
	if len(keys) == 0 {
		h.keys.Store(nil)
		return
	}
	digests := make([][sha256.Size]byte, len(keys))
	for i, k := range keys {
		digests[i] = sha256.Sum256(k)
	}
	h.keys.Store(&digests)
}

// authorized reports whether ctx's request may pass: no keys are set, or
// it carries one of them. When it may not, the 401 is written.
func (h *Handler) authorized(ctx *fasthttp.RequestCtx) bool {
	keys := h.keys.Load()
	if keys == nil {
		return true
	}
	token := ctx.Request.Header.PeekBytes(strXAPIKey)
	if auth := ctx.Request.Header.PeekBytes(strAuthorization); len(auth) > len(strBearer) && bytes.EqualFold(auth[:len(strBearer)], strBearer) {
		token = auth[len(strBearer):]
	}
	if len(token) > 0 {
		d := sha256.Sum256(token)
		match := 0
		for i := range *keys {
			match |= subtle.ConstantTimeCompare(d[:], (*keys)[i][:])
		}
		if match == 1 {
			return true
		}
	}
	writeError(ctx, fasthttp.StatusUnauthorized, errBodyUnauthorized)
	ctx.Response.Header.SetCanonical(strWWWAuthenticate, bearerRealm)
	return false
}
