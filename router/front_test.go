package router

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/openai/openai-go/responses"

	"github.com/warmroute/warmroute/upstream"
)

// rawRoundTrip writes raw on a new connection and reads one response.
func rawRoundTrip(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The front door refuses what a reverse proxy must not pass on, each with
// an OpenAI-style JSON error, and the replica sees none of it; an
// absolute-form target reaches the replica as a path, its host dropped.
func TestStrictFront(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize = 1000
	})
	for _, tt := range []struct {
		name, raw string
		status    int
		typ       string
	}{
		{"CONNECT", "CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n", 405, "method_not_allowed"},
		{"HTTP/9.9", "GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
		{"HTTP/2.0 over HTTP/1 framing", "GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"},
		{"header name with spaces", "GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header Name: v\r\n\r\n", 400, "invalid_request_error"},
		{"header name with a slash", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX/Y: v\r\n\r\n", 400, "invalid_request_error"},
		{"authority-form target", "GET example.com:80 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_request_error"},
		{"Expect with a body over the limit", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n", 413, "request_too_large"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := rawRoundTrip(t, p.addr, tt.raw)
			if resp.StatusCode != tt.status || !strings.Contains(body, `"type":"`+tt.typ+`"`) {
				t.Fatalf("got %d %s, want %d with type %s", resp.StatusCode, body, tt.status, tt.typ)
			}
		})
	}
	if n := a.requests.Load(); n != 0 {
		t.Fatalf("the replica saw %d of the refused requests", n)
	}
	resp, body := rawRoundTrip(t, p.addr, "GET http://evil.example/v1/models?x=1 HTTP/1.1\r\nHost: evil.example\r\n\r\n")
	if resp.StatusCode != 200 || resp.Header.Get("X-Replica-Saw-Path") != "/v1/models?x=1" || resp.Header.Get("X-Replica-Saw-Host") != a.addr {
		t.Fatalf("absolute-form: %d, replica saw path %q host %q: %s", resp.StatusCode, resp.Header.Get("X-Replica-Saw-Path"), resp.Header.Get("X-Replica-Saw-Host"), body)
	}
	// Expect: 100-continue within the limit still gets its 100 and an answer.
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("no 100 Continue: %q", line)
	}
	br.ReadString('\n')
	io.WriteString(c, "{}")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after 100 Continue: %v %v", resp, err)
	}
}

// A request head whose lines end in a bare LF gets its 400 at once, not
// after -client-read-timeout (here longer than the test's own deadline),
// and never reaches a replica; a head that fasthttp reads whole, ended by
// CRLFCRLF, is served as before, on the same connection as the next.
func TestBareLFHeadGetsA400AtOnce(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.ReadTimeout = time.Minute
	})
	for _, raw := range []string{
		"GET /v1/models HTTP/1.1\nHost: x\n\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\n\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 2\n\n{}",
	} {
		c := dialProxy(t, p) // its deadline, 10 s, comes before the read timeout
		io.WriteString(c, raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: no answer: %v", raw, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !resp.Close || !strings.Contains(string(body), "bare LF") {
			t.Errorf("%q: %d %s (close %v), want a 400 naming the bare LF, the connection closed", raw, resp.StatusCode, body, resp.Close)
		}
	}
	if n := a.requests.Load(); n != 0 {
		t.Errorf("the replica had %d requests", n)
	}
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /v1/models HTTP/1.1\nHost: x\r\n\r\n"+rawChat(chat(1, 1), ""))
	for _, method := range []string{"GET", "POST"} {
		if resp, body := readAnswer(t, br, method); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", method, resp.StatusCode, body)
		}
	}
}

// Profiles are served on the admin listener only with -pprof; /health there
// says 503 once the proxy drains.
func TestAdminExposure(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	for _, withPprof := range []bool{false, true} {
		srv := httptest.NewServer(p.h.Admin(withPprof))
		resp, err := http.Get(srv.URL + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{false: 404, true: 200}[withPprof]; resp.StatusCode != want {
			t.Errorf("pprof=%v: /debug/pprof/ answered %d, want %d", withPprof, resp.StatusCode, want)
		}
		srv.Close()
	}
	srv := httptest.NewServer(p.h.Admin(false))
	defer srv.Close()
	p.h.Drain()
	for _, url := range []string{srv.URL + "/health", p.url("/health")} {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || string(b) != `{"status":"draining"}` {
			t.Errorf("%s while draining: %d %s", url, resp.StatusCode, b)
		}
	}
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 {
		t.Errorf("a request while draining: %d, want it served", r.status)
	}
}

// With API keys set, a request needs one of them, as a bearer token or an
// X-Api-Key header; /health does not. The Authorization header reaches
// the replica unless it is stripped.
func TestAPIKeys(t *testing.T) {
	for _, strip := range []bool{false, true} {
		t.Run(fmt.Sprintf("strip=%v", strip), func(t *testing.T) {
			a := startReplica(t, "a", nil)
			p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
				c.StripAuthorization = strip
			})
			p.h.SetKeys([][]byte{[]byte("sk-one"), []byte("sk-two-longer")})
			for _, tt := range []struct {
				hdr    []string
				status int
			}{
				{nil, 401},
				{[]string{"Authorization", "Bearer sk-wrong"}, 401},
				{[]string{"Authorization", "Bearer sk-on"}, 401},
				{[]string{"Authorization", "sk-one"}, 401},
				{[]string{"Authorization", "Bearer sk-one"}, 200},
				{[]string{"Authorization", "bearer sk-two-longer"}, 200},
				{[]string{"X-Api-Key", "sk-two-longer"}, 200},
			} {
				r := post(p, "/v1/chat/completions", chat(1, 1), tt.hdr...)
				if r.status != tt.status {
					t.Errorf("%q: %d, want %d", tt.hdr, r.status, tt.status)
				}
				if r.status == 401 && (!strings.Contains(r.body, `"type":"invalid_api_key"`) || r.header.Get("WWW-Authenticate") == "") {
					t.Errorf("%q: 401 without a JSON error or WWW-Authenticate: %s", tt.hdr, r.body)
				}
				if r.status == 200 && tt.hdr[0] == "Authorization" {
					if saw := r.header.Get("X-Replica-Saw-Auth"); (saw == "") != strip {
						t.Errorf("strip=%v: the replica saw Authorization %q", strip, saw)
					}
				}
			}
			if a.requests.Load() != 3 {
				t.Errorf("the replica saw %d requests, want the 3 with a key", a.requests.Load())
			}
			resp, err := http.Get(p.url("/health"))
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("/health with keys set: %v %v", resp, err)
			}
			resp.Body.Close()
			p.h.SetKeys(nil)
			if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 {
				t.Errorf("with the keys removed: %d", r.status)
			}
		})
	}
}

// The access log writes one line per request with what an operator needs;
// off, it writes none.
func TestAccessLog(t *testing.T) {
	for _, on := range []bool{false, true} {
		a := startReplica(t, "a", sse(2, nil))
		p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
			c.AccessLog = on
		})
		body := `{"stream":true,"model":"qwen-32b","messages":[{"role":"user","content":"hi"}]}`
		r := post(p, "/v1/chat/completions", body)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		waitFor(t, "the request to be counted", func() bool { return p.metric(t, "warmroute_request_duration_seconds_count") == "1" })
		n := p.logs.count("request")
		if !on {
			if n != 0 {
				t.Fatalf("access log off, %d lines", n)
			}
			continue
		}
		line := p.logs.String()
		for _, want := range []string{"msg=request ", "method=POST", "path=/v1/chat/completions", "model=qwen-32b", "replica=" + a.addr, "route=spread", "status=200", "ttfb=", "duration=", fmt.Sprintf("bytes=%d", len(r.body))} {
			if !strings.Contains(line, want) {
				t.Errorf("access log line lacks %q:\n%s", want, line)
			}
		}
	}
}

func TestModelOf(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m1","messages":[]}`:    "m1",
		`{"messages":[], "model" : "m2"}`: "m2",
		`{"model":"a\"b"}`:                "",
		`{"model":7}`:                     "",
		`{"messages":[]}`:                 "",
	} {
		if got := string(modelOf([]byte(body))); got != want {
			t.Errorf("modelOf(%s) = %q, want %q", body, got, want)
		}
	}
}

// Requests that carry one session id go to one replica, whatever their
// messages; without it, fresh requests spread.
func TestSessionHeader(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
		c.SessionHeaders = []string{"X-Session-ID"}
	})
	first := post(p, "/v1/chat/completions", chat(100, 1), "X-Session-ID", "agent-7")
	for i := 0; i < 6; i++ {
		r := post(p, "/v1/chat/completions", chat(i, 1), "X-Session-ID", "agent-7")
		if r.status != 200 || r.replica != first.replica || r.route != "session" {
			t.Fatalf("request %d of the session: %d on %s (%s), want %s", i, r.status, r.replica, r.route, first.replica)
		}
	}
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		seen[post(p, "/v1/chat/completions", chat(10+i, 1)).replica] = true
	}
	if len(seen) != 2 {
		t.Fatalf("without a session, fresh requests went to %v", seen)
	}
}

// Anthropic Messages requests (/v1/messages, as Claude Code sends them with
// ?beta=true) are chained like chat: the next turn lands on the replica of
// the one before.
func TestAnthropicMessagesArePinned(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	turn := func(conv, n int) string {
		var msgs []string
		for i := 0; i < n; i++ {
			role := []string{"user", "assistant"}[i%2]
			msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":[{"type":"text","text":"conversation %d turn %d"}]}`, role, conv, i))
		}
		return `{"model":"claude","system":"be brief","max_tokens":8,"messages":[` + strings.Join(msgs, ",") + `]}`
	}
	where := map[int]string{}
	for c := 0; c < 2; c++ {
		where[c] = post(p, "/v1/messages?beta=true", turn(c, 1)).replica
	}
	if where[0] == where[1] {
		t.Fatalf("two new conversations on one replica: %v", where)
	}
	for n := 3; n <= 7; n += 2 {
		for c := 0; c < 2; c++ {
			if r := post(p, "/v1/messages?beta=true", turn(c, n)); r.status != 200 || r.replica != where[c] || r.route != "pinned" {
				t.Fatalf("conversation %d, %d messages: %d on %s (%s), want %s pinned", c, n, r.status, r.replica, r.route, where[c])
			}
		}
	}
}

// stringOf never panics and returns a plain run of the body, or nothing.
func FuzzStringOf(f *testing.F) {
	for _, s := range []string{`{"id":"resp_1"}`, `{"id" : "x\"y"}`, `{"id":`, `"id"`, `{"previous_response_id":"r","id":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, key := range [][]byte{strIDKey, strPrevKey, strModelKey} {
			v := stringOf(body, key)
			if len(v) > 0 && (!bytes.Contains(body, v) || bytes.ContainsAny(v, "\"\\\\")) {
				t.Fatalf("stringOf(%q, %s) = %q", body, key, v)
			}
		}
	})
}

// The inference API is forwarded, under a gateway's prefix too, with every
// method; any other path gets warmroute's own 404 naming -forward-path,
// the engines' administrative endpoints first, unless -forward-path names
// one; a path with dot segments or an encoded slash or dot gets a 400
// before anything else reads it. The replica sees none of the refused.
func TestForwardedPaths(t *testing.T) {
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Method", r.Method)
		fmt.Fprintf(w, "path=%s", r.URL.RequestURI())
	})
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
		c.ForwardPaths = []string{"/reset_prefix_cache"}
	})
	for _, tt := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/v1/chat/completions", 200},
		{"POST", "/v1/chat/completions?x=1", 200},
		{"POST", "/chat/completions", 200},
		{"POST", "/v1/completions", 200},
		{"POST", "/completion", 200},
		{"POST", "/infill", 200},
		{"POST", "/v1/responses", 200},
		{"GET", "/v1/responses/resp_1", 200},
		{"DELETE", "/v1/responses/resp_1", 200},
		{"POST", "/v1/responses/resp_1/cancel", 200},
		{"GET", "/v1/responses/resp_1/input_items?limit=2", 200},
		{"POST", "/v1/messages?beta=true", 200},
		{"POST", "/v1/messages/count_tokens", 200},
		{"POST", "/v1/embeddings", 200},
		{"POST", "/embedding", 200},
		{"GET", "/v1/models", 200},
		{"GET", "/v1/models/meta-llama/Llama-3.1-8B", 200},
		{"POST", "/tokenize", 200},
		{"POST", "/detokenize", 200},
		{"POST", "/v1/tokenize", 200},
		{"POST", "/rerank", 200},
		{"POST", "/v2/rerank", 200},
		{"POST", "/v1/reranking", 200},
		{"POST", "/score", 200},
		{"POST", "/v1/audio/transcriptions", 200},
		{"POST", "/v1/audio/translations", 200},
		{"POST", "/v1/audio/speech", 200},
		{"POST", "/reset_prefix_cache", 200}, // named by -forward-path
		{"POST", "/reset_prefix_cache/x", 404},
		{"POST", "/reset_mm_cache", 404},
		{"POST", "/sleep", 404},
		{"POST", "/wake_up", 404},
		{"POST", "/collective_rpc", 404},
		{"POST", "/v1/load_lora_adapter", 404},
		{"POST", "/v1/unload_lora_adapter", 404},
		{"GET", "/metrics", 404},
		{"POST", "/start_profile", 404},
		{"POST", "/scale_elastic_ep", 404},
		{"POST", "/flush_cache", 404},
		{"POST", "/update_weights_from_disk", 404},
		{"GET", "/slots", 404},
		{"POST", "/lora-adapters", 404},
		{"GET", "/", 404},
		{"GET", "/v1/responses/", 404},
		{"GET", "/v1/responses/a/b", 404},
		{"GET", "/v1/models/", 404},
		{"POST", "/openai/v1/chat/completions", 404},
		{"POST", "/v1/chat/completions/", 404},
		{"GET", "/v1/chat/completions/chatcmpl-1", 404},
		{"POST", "/v1/files", 404},
		{"POST", "/v1/messages/batches", 404},
		{"GET", "/health/../metrics", 400},
		{"GET", "/v1/../../health", 400},
		{"POST", "/v1/./chat/completions", 400},
		{"POST", "/v1/chat/completions/..", 400},
		{"POST", "/v1/chat%2Fcompletions", 400},
		{"POST", "/v1/chat/completions%2f", 400},
		{"POST", "/v1/%2e%2e/sleep", 400},
		{"POST", "/%2E/v1/chat/completions", 400},
	} {
		resp, body := rawRoundTrip(t, p.addr, tt.method+" "+tt.path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		switch {
		case resp.StatusCode != tt.status:
			t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, resp.StatusCode, body, tt.status)
		case tt.status == 200 && (body != "path="+tt.path || resp.Header.Get("X-Method") != tt.method):
			t.Errorf("%s %s: the replica saw %s %q", tt.method, tt.path, resp.Header.Get("X-Method"), body)
		case tt.status == 404 && !strings.Contains(body, "-forward-path"):
			t.Errorf("%s %s: a 404 that does not name -forward-path: %s", tt.method, tt.path, body)
		case tt.status == 400 && !strings.Contains(body, `"invalid_request_error"`):
			t.Errorf("%s %s: %s", tt.method, tt.path, body)
		}
	}
	if n, want := a.requests.Load(), int64(28); n != want {
		t.Errorf("the replica had %d requests, want the %d forwarded", n, want)
	}
}

// Every inference path that the official OpenAI and Anthropic Go clients
// call reaches the replica as the client wrote it: chat, completions,
// embeddings, models, the Responses API with a stored response's
// retrieve, delete, cancel and input items, audio, Messages and its token
// count. (Rerank, score and tokenize have no official client;
// TestForwardedPaths sends them.)
func TestOfficialClientPathsAreForwarded(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Forwarded-For") == "" {
			// The proxy's own probes: no model list, so that GET
			// /v1/models goes to the replica too.
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		seen[r.Method+" "+r.URL.Path] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	})
	p := startProxy(t, Adaptive, []string{a.url()})
	ctx := context.Background()
	oc := openai.NewClient(option.WithBaseURL(p.url("/v1/")), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ac := anthropic.NewClient(anthropicoption.WithBaseURL(p.url("/")), anthropicoption.WithAPIKey("sk-test"), anthropicoption.WithMaxRetries(0))
	calls := []struct {
		want string
		call func() error
	}{
		{"POST /v1/chat/completions", func() error {
			_, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
			return err
		}},
		{"POST /v1/completions", func() error {
			_, err := oc.Completions.New(ctx, openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}})
			return err
		}},
		{"POST /v1/embeddings", func() error {
			_, err := oc.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "m", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hi")}})
			return err
		}},
		{"GET /v1/models", func() error { _, err := oc.Models.List(ctx); return err }},
		{"GET /v1/models/m", func() error { _, err := oc.Models.Get(ctx, "m"); return err }},
		{"POST /v1/responses", func() error {
			_, err := oc.Responses.New(ctx, responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
			return err
		}},
		{"GET /v1/responses/resp_1", func() error {
			_, err := oc.Responses.Get(ctx, "resp_1", responses.ResponseGetParams{})
			return err
		}},
		{"DELETE /v1/responses/resp_1", func() error { return oc.Responses.Delete(ctx, "resp_1") }},
		{"POST /v1/responses/resp_1/cancel", func() error { _, err := oc.Responses.Cancel(ctx, "resp_1"); return err }},
		{"GET /v1/responses/resp_1/input_items", func() error {
			_, err := oc.Responses.InputItems.List(ctx, "resp_1", responses.InputItemListParams{})
			return err
		}},
		{"POST /v1/audio/transcriptions", func() error {
			_, err := oc.Audio.Transcriptions.New(ctx, openai.AudioTranscriptionNewParams{Model: "w", File: strings.NewReader("RIFF")})
			return err
		}},
		{"POST /v1/audio/translations", func() error {
			_, err := oc.Audio.Translations.New(ctx, openai.AudioTranslationNewParams{Model: "w", File: strings.NewReader("RIFF")})
			return err
		}},
		{"POST /v1/audio/speech", func() error {
			resp, err := oc.Audio.Speech.New(ctx, openai.AudioSpeechNewParams{Model: "tts", Input: "hi", Voice: "alloy"})
			if err == nil {
				resp.Body.Close()
			}
			return err
		}},
		{"POST /v1/messages", func() error {
			_, err := ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "m", MaxTokens: 1,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
			return err
		}},
		{"POST /v1/messages/count_tokens", func() error {
			_, err := ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "m",
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
			return err
		}},
		{"GET /v1/models", func() error { _, err := ac.Models.List(ctx, anthropic.ModelListParams{}); return err }},
		{"GET /v1/models/m", func() error { _, err := ac.Models.Get(ctx, "m", anthropic.ModelGetParams{}); return err }},
	}
	for _, c := range calls {
		mu.Lock()
		delete(seen, c.want)
		mu.Unlock()
		err := c.call()
		mu.Lock()
		ok := seen[c.want]
		mu.Unlock()
		if !ok {
			t.Errorf("%s did not reach the replica (client error: %v)", c.want, err)
		}
	}
}
