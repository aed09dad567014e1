package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"
)

// The Responses API (POST /v1/responses) as vLLM serves it with its store
// on: each answer is kept in the replica's memory under its id, and a
// request whose previous_response_id names one continues that
// conversation; an id the replica does not hold is a 404. The prompt is
// the instructions, the stored conversation, its last answer and the new
// input, rendered as chat renders messages, so that each turn extends the
// last turn's prompt and finds it in the cache.

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       string          `json:"instructions"`
	PreviousResponseID string          `json:"previous_response_id"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
}

// inputItem is one element of an input array: a message (with or without
// "type": "message"), a function call or its output, or reasoning.
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// inputMessages turns input (a string, or an array of items) into chat
// messages. Reasoning items are left out, as vLLM leaves them out.
func inputMessages(input json.RawMessage) ([]message, error) {
	if len(input) == 0 || string(input) == "null" {
		return nil, fmt.Errorf("input is required")
	}
	var text string
	if json.Unmarshal(input, &text) == nil {
		return []message{{Role: "user", Content: input}}, nil
	}
	var items []inputItem
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, fmt.Errorf("input must be a string or an array of items: %v", err)
	}
	var msgs []message
	for _, it := range items {
		switch it.Type {
		case "", "message":
			msgs = append(msgs, message{Role: it.Role, Content: it.Content})
		case "function_call":
			call, _ := json.Marshal([]any{map[string]any{"id": it.CallID, "type": "function",
				"function": map[string]string{"name": it.Name, "arguments": it.Arguments}}})
			msgs = append(msgs, message{Role: "assistant", ToolCalls: call})
		case "function_call_output":
			msgs = append(msgs, message{Role: "tool", ToolCallID: it.CallID, Content: it.Output})
		case "reasoning":
		default:
			return nil, fmt.Errorf("input item type %q is not supported", it.Type)
		}
	}
	return msgs, nil
}

// responseError answers in the OpenAI error format that vLLM's Responses
// API uses: {"error": {...}} with the status as its code.
func responseError(w http.ResponseWriter, status int, typ, param, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var p any
	if param != "" {
		p = param
	}
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": p, "code": status}})
}

// responseObject is a response as the API returns it. The id comes first,
// as in OpenAI's and vLLM's answers: a proxy may read it without parsing.
type responseObject struct {
	ID                 string         `json:"id"`
	Object             string         `json:"object"`
	CreatedAt          int64          `json:"created_at"`
	Model              string         `json:"model"`
	Status             string         `json:"status"`
	Instructions       *string        `json:"instructions"`
	PreviousResponseID *string        `json:"previous_response_id"`
	Output             []outputItem   `json:"output"`
	Usage              *responseUsage `json:"usage"`
	Store              bool           `json:"store"`
}

type outputItem struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// responseUsage is the Responses API's usage, with the engine's cached
// tokens and the simulator's timings.
type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
	Sim         struct {
		TTFTMs    float64 `json:"ttft_ms"`
		LatencyMs float64 `json:"latency_ms"`
	} `json:"sim"`
}

func newID(prefix string) string {
	return fmt.Sprintf("%s_%016x%016x", prefix, rand.Uint64(), rand.Uint64())
}

func (r *Replica) responses(w http.ResponseWriter, hr *http.Request) {
	r.requests.Add(1)
	body, err := io.ReadAll(hr.Body)
	if err != nil {
		return
	}
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		responseError(w, http.StatusBadRequest, "invalid_request_error", "", "invalid JSON: "+err.Error())
		return
	}
	input, err := inputMessages(req.Input)
	if err != nil {
		responseError(w, http.StatusBadRequest, "invalid_request_error", "input", err.Error())
		return
	}
	var history []message
	if req.PreviousResponseID != "" {
		r.storeMu.Lock()
		prev, ok := r.stored[req.PreviousResponseID]
		r.storeMu.Unlock()
		if !ok {
			responseError(w, http.StatusNotFound, "invalid_request_error", "response_id",
				fmt.Sprintf("Response with id '%s' not found.", req.PreviousResponseID))
			return
		}
		history = prev
	}
	maxTokens, ok := r.maxTokens(w, req.MaxOutputTokens)
	if !ok {
		return
	}
	model, ok := r.model(w, req.Model)
	if !ok {
		return
	}
	// The instructions are this request's alone: a stored conversation
	// keeps its messages, not the instructions it was asked with.
	conv := append(append([]message(nil), history...), input...)
	prompt := conv
	if req.Instructions != "" {
		sys, _ := json.Marshal(req.Instructions)
		prompt = append([]message{{Role: "system", Content: sys}}, conv...)
	}
	eng, s := r.submit(render(&request{Messages: prompt}), maxTokens)

	resp := responseObject{ID: newID("resp"), Object: "response", CreatedAt: time.Now().Unix(), Model: model,
		Status: "in_progress", Output: []outputItem{}, Store: req.Store == nil || *req.Store}
	if req.Instructions != "" {
		resp.Instructions = &req.Instructions
	}
	if req.PreviousResponseID != "" {
		resp.PreviousResponseID = &req.PreviousResponseID
	}
	item := outputItem{ID: newID("msg"), Type: "message", Status: "in_progress", Role: "assistant", Content: []outputText{}}
	// complete fills in the answer of n tokens and stores it.
	complete := func(n int) {
		u := r.usage(eng, s, n)
		var ru responseUsage
		ru.InputTokens, ru.OutputTokens, ru.TotalTokens = u.PromptTokens, u.CompletionTokens, u.TotalTokens
		ru.InputTokensDetails.CachedTokens = u.PromptTokensDetails.CachedTokens
		ru.Sim = u.Sim
		text := tokenText(n)
		item.Status = "completed"
		item.Content = []outputText{{Type: "output_text", Text: text, Annotations: []any{}}}
		resp.Status, resp.Output, resp.Usage = "completed", []outputItem{item}, &ru
		if resp.Store {
			answer, _ := json.Marshal(text)
			r.storeMu.Lock()
			r.stored[resp.ID] = append(conv, message{Role: "assistant", Content: answer})
			r.storeMu.Unlock()
		}
	}
	if req.Stream {
		r.streamResponse(w, hr, eng, s, &resp, &item, complete)
		return
	}
	n, ok := relay(hr, eng, s, nil)
	if !ok {
		if n == 0 && hr.Context().Err() == nil {
			responseError(w, http.StatusServiceUnavailable, "server_error", "", "engine stopped")
		}
		return
	}
	complete(n)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(&resp)
}

// streamResponse writes the Responses API's named events: response.created
// at once (its id first, for a proxy that follows ids), the output item and
// its text part, one response.output_text.delta per token, then the done
// events and response.completed with the usage.
func (r *Replica) streamResponse(w http.ResponseWriter, hr *http.Request, eng *engine, s *seq, resp *responseObject, item *outputItem, complete func(int)) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	seq := 0
	event := func(typ string, fields map[string]any) {
		fields["type"] = typ
		fields["sequence_number"] = seq
		seq++
		b, _ := json.Marshal(fields)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		fl.Flush()
	}
	event("response.created", map[string]any{"response": resp})
	event("response.in_progress", map[string]any{"response": resp})
	part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
	at := func(fields map[string]any) map[string]any {
		fields["item_id"], fields["output_index"], fields["content_index"] = item.ID, 0, 0
		return fields
	}
	n, ok := relay(hr, eng, s, func(n int) {
		if n == 1 {
			event("response.output_item.added", map[string]any{"output_index": 0, "item": item})
			event("response.content_part.added", at(map[string]any{"part": part}))
		}
		event("response.output_text.delta", at(map[string]any{"delta": tokenText(1), "logprobs": []any{}}))
	})
	if !ok {
		return // the client left, or the engine stopped: the stream is cut
	}
	complete(n)
	text := item.Content[0].Text
	event("response.output_text.done", at(map[string]any{"text": text, "logprobs": []any{}}))
	event("response.content_part.done", at(map[string]any{"part": item.Content[0]}))
	event("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	event("response.completed", map[string]any{"response": resp})
}
