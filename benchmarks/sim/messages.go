package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Anthropic's Messages API (POST /v1/messages, Claude Code's), as vLLM
// serves it: the system prompt and the messages are rendered as chat
// renders its messages. Usage is Anthropic's: input_tokens counts the
// prompt tokens that were not read from the cache, cache_read_input_tokens
// those that were.

type messagesRequest struct {
	Model     string          `json:"model"`
	MaxTokens *int            `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Stream bool `json:"stream"`
}

type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

// anthropicError answers in Anthropic's error format.
func anthropicError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

func (r *Replica) messages(w http.ResponseWriter, hr *http.Request) {
	r.requests.Add(1)
	body, err := io.ReadAll(hr.Body)
	if err != nil {
		return
	}
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON: "+err.Error())
		return
	}
	if len(req.Messages) == 0 {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", "messages: at least one message is required")
		return
	}
	maxTokens, ok := r.maxTokens(w, req.MaxTokens)
	if !ok {
		return
	}
	model, ok := r.model(w, req.Model)
	if !ok {
		return
	}
	var msgs []message
	if len(req.System) > 0 && string(req.System) != "null" {
		// A string or text blocks: appendContent reads both.
		msgs = append(msgs, message{Role: "system", Content: req.System})
	}
	for _, m := range req.Messages {
		msgs = append(msgs, message{Role: m.Role, Content: m.Content})
	}
	eng, s := r.submit(render(&request{Messages: msgs}), maxTokens)
	id := newID("msg")
	usage := func(n int) anthropicUsage {
		u := r.usage(eng, s, n)
		c := u.PromptTokensDetails.CachedTokens
		return anthropicUsage{InputTokens: u.PromptTokens - c, CacheReadInputTokens: c, OutputTokens: n}
	}
	reply := func(content []any, stop any, u anthropicUsage) map[string]any {
		return map[string]any{"id": id, "type": "message", "role": "assistant", "model": model,
			"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": u}
	}
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		fl.Flush()
		event := func(typ string, fields map[string]any) {
			fields["type"] = typ
			b, _ := json.Marshal(fields)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
			fl.Flush()
		}
		n, ok := relay(hr, eng, s, func(n int) {
			if n == 1 {
				// The prompt was read (from the cache or not) by now.
				u := usage(0)
				event("message_start", map[string]any{"message": reply([]any{}, nil, u)})
				event("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
			}
			event("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": tokenText(1)}})
		})
		if !ok {
			return // the client left, or the engine stopped: the stream is cut
		}
		event("content_block_stop", map[string]any{"index": 0})
		event("message_delta", map[string]any{"delta": map[string]any{"stop_reason": "max_tokens", "stop_sequence": nil}, "usage": usage(n)})
		event("message_stop", map[string]any{})
		return
	}
	n, ok := relay(hr, eng, s, nil)
	if !ok {
		if n == 0 && hr.Context().Err() == nil {
			anthropicError(w, http.StatusServiceUnavailable, "overloaded_error", "engine stopped")
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(reply([]any{map[string]any{"type": "text", "text": tokenText(n)}}, "max_tokens", usage(n)))
}
