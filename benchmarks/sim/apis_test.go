package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

// post sends body to path and returns the status and the body.
func post(t *testing.T, r *Replica, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(r.URL()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

type sseEvent struct {
	name string
	data map[string]any
	raw  string
}

// events reads a stream of named events; each data line must match its
// event line's type.
func events(t *testing.T, r *Replica, path, body string) []sseEvent {
	t.Helper()
	resp, err := http.Post(r.URL()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var out []sseEvent
	var name string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev := sseEvent{name: name, raw: strings.TrimPrefix(line, "data: ")}
			if err := json.Unmarshal([]byte(ev.raw), &ev.data); err != nil {
				t.Fatalf("event %s: %v: %s", name, err, ev.raw)
			}
			if ev.data["type"] != name {
				t.Fatalf("event line %q, data type %v", name, ev.data["type"])
			}
			out = append(out, ev)
			name = ""
		}
	}
	return out
}

func names(evs []sseEvent) string {
	var s []string
	for i, e := range evs {
		if i > 0 && e.name == evs[i-1].name {
			continue
		}
		s = append(s, e.name)
	}
	return strings.Join(s, " ")
}

type response struct {
	ID     string
	Object string
	Status string
	Output []struct {
		Type    string
		Role    string
		Content []struct{ Type, Text string }
	}
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
}

func respond(t *testing.T, r *Replica, body string) response {
	t.Helper()
	status, b := post(t, r, "/v1/responses", body)
	if status != 200 {
		t.Fatalf("status %d: %s", status, b)
	}
	var out response
	if err := json.Unmarshal([]byte(b), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b, `{"id":"resp_`) {
		t.Fatalf("the id does not come first: %.80s", b)
	}
	return out
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A conversation chained by previous_response_id: each turn's prompt is the
// last one's and its answer and more, found in the cache; the store is
// this replica's alone, so another replica does not know the id, and
// neither does this one once restarted.
func TestResponsesStore(t *testing.T) {
	r, other := start(t, fastConfig()), start(t, fastConfig())
	repo := jsonString("Here is the repository:\n" + workload.Text(3, 8_000))
	first := respond(t, r, `{"model":"m","instructions":"You are a coding agent.","max_output_tokens":4,"input":`+repo+`}`)
	if first.Object != "response" || first.Status != "completed" || len(first.Output) != 1 ||
		first.Output[0].Role != "assistant" || first.Output[0].Content[0].Type != "output_text" || first.Output[0].Content[0].Text != "tok tok tok tok " {
		t.Fatalf("first: %+v", first)
	}
	u := first.Usage
	if u.InputTokens < 2_000 || u.InputTokensDetails.CachedTokens != 0 || u.OutputTokens != 4 || u.TotalTokens != u.InputTokens+4 {
		t.Fatalf("first usage %+v", u)
	}
	prev, inputs := first.ID, u.InputTokens
	for turn, input := range []string{`"Now fix the bug."`, `[{"type":"message","role":"user","content":[{"type":"input_text","text":"And test it."}]}]`} {
		next := respond(t, r, fmt.Sprintf(`{"model":"m","instructions":"You are a coding agent.","max_output_tokens":4,"previous_response_id":%q,"input":%s}`, prev, input))
		u := next.Usage
		if u.InputTokens <= inputs || u.InputTokensDetails.CachedTokens < inputs-16 {
			t.Fatalf("turn %d: %+v: the last turn's %d input tokens are not all cached", turn+2, u, inputs)
		}
		if next.ID == prev {
			t.Fatal("an id was given twice")
		}
		prev, inputs = next.ID, u.InputTokens
	}

	notFound := func(r *Replica, id string) {
		t.Helper()
		status, b := post(t, r, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"more","previous_response_id":%q}`, id))
		want := fmt.Sprintf(`{"error":{"code":404,"message":"Response with id '%s' not found.","param":"response_id","type":"invalid_request_error"}}`, id)
		if status != 404 || strings.TrimSpace(b) != want {
			t.Fatalf("unknown id: %d %s", status, b)
		}
	}
	notFound(other, prev)
	notFound(r, "resp_nope")

	// store:false keeps nothing.
	unstored := respond(t, r, `{"model":"m","input":"hi","store":false}`)
	notFound(r, unstored.ID)

	r.Stop()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections() // the old process's connections are gone
	notFound(r, prev)
}

// A streamed response: named events as OpenAI sends them, response.created
// first with the id at the front of its response, a delta per token, and
// response.completed with the usage; the stored answer continues.
func TestResponsesStream(t *testing.T) {
	r := start(t, fastConfig())
	repo := jsonString(workload.Text(4, 4_000))
	body := func(prev string) string {
		b := `{"model":"m","stream":true,"max_output_tokens":3,"input":[{"role":"user","content":` + repo + `}]`
		if prev != "" {
			b += `,"previous_response_id":"` + prev + `"`
		}
		return b + "}"
	}
	evs := events(t, r, "/v1/responses", body(""))
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.done response.content_part.done response.output_item.done response.completed"
	if got := names(evs); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	if !strings.HasPrefix(evs[0].raw, `{"response":{"id":"resp_`) {
		t.Fatalf("response.created: %s", evs[0].raw)
	}
	var text string
	for i, e := range evs {
		if e.data["sequence_number"] != float64(i) {
			t.Fatalf("event %d has sequence_number %v", i, e.data["sequence_number"])
		}
		if e.name == "response.output_text.delta" {
			text += e.data["delta"].(string)
		}
	}
	var done struct{ Response response }
	json.Unmarshal([]byte(evs[len(evs)-1].raw), &done)
	created := evs[0].data["response"].(map[string]any)
	if text != "tok tok tok " || done.Response.Output[0].Content[0].Text != text || done.Response.ID != created["id"] ||
		done.Response.Status != "completed" || done.Response.Usage.OutputTokens != 3 || done.Response.Usage.InputTokens < 1_000 {
		t.Fatalf("text %q, completed %+v", text, done.Response)
	}
	evs = events(t, r, "/v1/responses", body(done.Response.ID))
	json.Unmarshal([]byte(evs[len(evs)-1].raw), &done)
	if u := done.Response.Usage; u.InputTokensDetails.CachedTokens < 1_000 {
		t.Fatalf("the streamed turn 2 found %d of %d tokens cached", u.InputTokensDetails.CachedTokens, u.InputTokens)
	}
}

type anthropicMessage struct {
	ID         string
	Type       string
	Role       string
	Content    []struct{ Type, Text string }
	StopReason string `json:"stop_reason"`
	Usage      anthropicUsage
}

// Anthropic's Messages API: a system of blocks, content blocks, the next
// turn (re-sending the history, with ?beta=true as Claude Code sends it)
// reads the last prompt from the cache.
func TestMessages(t *testing.T) {
	r := start(t, fastConfig())
	repo := jsonString(workload.Text(5, 8_000))
	turn1 := `[{"role":"user","content":[{"type":"text","text":` + repo + `,"cache_control":{"type":"ephemeral"}}]}]`
	body := func(msgs string) string {
		return `{"model":"m","max_tokens":4,"system":[{"type":"text","text":"You are Claude Code."}],"messages":` + msgs + `}`
	}
	ask := func(path, body string) anthropicMessage {
		t.Helper()
		status, b := post(t, r, path, body)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		var m anthropicMessage
		json.Unmarshal([]byte(b), &m)
		return m
	}
	first := ask("/v1/messages", body(turn1))
	if first.Type != "message" || first.Role != "assistant" || first.StopReason != "max_tokens" || len(first.Content) != 1 ||
		first.Content[0].Type != "text" || first.Content[0].Text != "tok tok tok tok " {
		t.Fatalf("first: %+v", first)
	}
	if u := first.Usage; u.InputTokens < 2_000 || u.CacheReadInputTokens != 0 || u.OutputTokens != 4 {
		t.Fatalf("first usage %+v", u)
	}
	turn2 := turn1[:len(turn1)-1] + `,{"role":"assistant","content":[{"type":"text","text":"tok tok tok tok "}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]`
	second := ask("/v1/messages?beta=true", body(turn2))
	if u := second.Usage; u.CacheReadInputTokens < first.Usage.InputTokens-16 || u.InputTokens > 64 {
		t.Fatalf("turn 2 usage %+v: turn 1's %d tokens are not read from the cache", u, first.Usage.InputTokens)
	}
	// A system prompt given as a string renders as its one text block.
	if u := ask("/v1/messages", `{"model":"m","max_tokens":1,"system":"You are Claude Code.","messages":`+turn1+`}`).Usage; u.CacheReadInputTokens < first.Usage.InputTokens-16 {
		t.Fatalf("a string system prompt missed the cache: %+v", u)
	}

	status, b := post(t, r, "/v1/messages", `{"model":"m","max_tokens":4,"messages":[]}`)
	if status != 400 || !strings.Contains(b, `"type":"error"`) || !strings.Contains(b, "invalid_request_error") {
		t.Fatalf("no messages: %d %s", status, b)
	}
}

// A streamed message: Anthropic's events in order, the usage in
// message_start and message_delta.
func TestMessagesStream(t *testing.T) {
	r := start(t, fastConfig())
	repo := jsonString(workload.Text(6, 4_000))
	body := `{"model":"m","max_tokens":3,"stream":true,"system":"You are Claude Code.","messages":[{"role":"user","content":` + repo + `}]}`
	check := func(cached bool) {
		t.Helper()
		evs := events(t, r, "/v1/messages?beta=true", body)
		want := "message_start content_block_start content_block_delta content_block_stop message_delta message_stop"
		if got := names(evs); got != want {
			t.Fatalf("events:\n got %s\nwant %s", got, want)
		}
		var text string
		for _, e := range evs {
			if e.name == "content_block_delta" {
				text += e.data["delta"].(map[string]any)["text"].(string)
			}
		}
		var start struct{ Message anthropicMessage }
		var delta struct {
			Delta struct {
				StopReason string `json:"stop_reason"`
			}
			Usage anthropicUsage
		}
		json.Unmarshal([]byte(evs[0].raw), &start)
		json.Unmarshal([]byte(evs[len(evs)-2].raw), &delta)
		if text != "tok tok tok " || delta.Delta.StopReason != "max_tokens" || delta.Usage.OutputTokens != 3 ||
			start.Message.Role != "assistant" || !strings.HasPrefix(start.Message.ID, "msg_") {
			t.Fatalf("text %q, start %+v, delta %+v", text, start, delta)
		}
		u := start.Message.Usage
		if u != (anthropicUsage{InputTokens: u.InputTokens, CacheReadInputTokens: u.CacheReadInputTokens}) || u.InputTokens+u.CacheReadInputTokens < 1_000 ||
			(u.CacheReadInputTokens > 0) != cached || delta.Usage.CacheReadInputTokens != u.CacheReadInputTokens {
			t.Fatalf("cached %v: start usage %+v, delta usage %+v", cached, u, delta.Usage)
		}
	}
	check(false)
	check(true)
}
