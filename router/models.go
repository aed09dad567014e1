package router

import (
	"encoding/json"
	"strings"

	"github.com/valyala/fasthttp"
)

// models answers GET /v1/models itself with the union of the live
// replicas' lists, and reports whether it did: with no list known, the
// request goes to a replica as any other. The front door's rules have
// passed already.
func (h *Handler) models(ctx *fasthttp.RequestCtx) bool {
	list := h.set.ModelList()
	if list == nil {
		return false
	}
	ctx.Response.Header.SetContentTypeBytes(strApplicationJSON)
	ctx.SetBody(list)
	return true
}

// noSuchModel answers a request for a model that no replica lists with the
// 404 an OpenAI server gives, naming the models that are served.
func (h *Handler) noSuchModel(x *exchange) {
	served := h.set.ModelNames()
	msg := "The model `" + string(modelOf(x.body)) + "` does not exist on any replica; served: " + strings.Join(served, ", ")
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": "invalid_request_error", "param": "model", "code": "model_not_found",
	}})
	x.answerOwn(fasthttp.StatusNotFound, body)
}
