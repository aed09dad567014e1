package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

var usageCases = []struct {
	name           string
	body           string
	prompt, cached int64
	ok             bool
}{
	{"vllm chat", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"total_tokens":1010,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":640}},"prompt_logprobs":null,"kv_transfer_params":null}`, 1000, 640, true},
	{"details null", `{"usage":{"prompt_tokens":37,"total_tokens":40,"completion_tokens":3,"prompt_tokens_details":null}}`, 37, 0, true},
	{"no details", `{"usage":{"prompt_tokens":37,"completion_tokens":3}}`, 37, 0, true},
	{"details first", `{"usage":{"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":16},"prompt_tokens":37}}`, 37, 16, true},
	{"spaces", "{ \"usage\" :\n { \"prompt_tokens\" : 7 ,\t\"prompt_tokens_details\" : { \"cached_tokens\" : 5 } } }", 7, 5, true},
	{"responses", `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}],"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":32},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":55},"user":null,"metadata":{}}`, 50, 32, true},
	{"anthropic", `{"id":"msg_1","type":"message","content":[{"type":"text","text":"x"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"cache_creation_input_tokens":20,"cache_read_input_tokens":70,"output_tokens":5,"cache_creation":{"ephemeral_5m_input_tokens":20,"ephemeral_1h_input_tokens":0},"service_tier":"standard"}}`, 100, 70, true},
	{"anthropic nulls", `{"usage":{"input_tokens":10,"cache_creation_input_tokens":null,"cache_read_input_tokens":null,"output_tokens":5}}`, 10, 0, true},
	{"simulator", `{"choices":[],"created":1,"id":"cmpl-sim-1","model":"m","object":"chat.completion","usage":{"prompt_tokens":90000,"completion_tokens":150,"total_tokens":90150,"prompt_tokens_details":{"cached_tokens":89984},"sim":{"ttft_ms":12.5,"latency_ms":800}}}` + "\n", 90000, 89984, true},
	{"sse final chunk", "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":288}}}\n\ndata: [DONE]\n\n", 300, 288, true},
	{"sse openai nulls then usage", "data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n", 9, 0, true},
	{"sse without usage", "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}],\"usage\":null}\n\ndata: [DONE]\n\n", 0, 0, false},
	{"sse anthropic", "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":120,\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 120, 0, true},
	{"last usage wins", `{"usage":{"prompt_tokens":5}} {"usage":{"prompt_tokens":6}}`, 6, 0, true},
	{"last usage null", `{"usage":{"prompt_tokens":5}} {"usage":null}`, 0, 0, false},
	{"usage as a value", `{"choices":[{"message":{"content":"usage"}}],"usage":{"prompt_tokens":3}}`, 3, 0, true},
	{"usage as a value after it", `{"usage":{"prompt_tokens":4},"note":"usage","tags":["usage"]}`, 4, 0, true},
	{"usage as a value only", `{"choices":[{"message":{"content":"usage"}}]}`, 0, 0, false},
	{"usage in an array", `{"tags":["usage",{"prompt_tokens":4}]}`, 0, 0, false},
	{"escaped usage", `{"content":"say \"usage\":{\"prompt_tokens\":5}"}`, 0, 0, false},
	{"escaped key", `{"a\"usage":{"prompt_tokens":5}}`, 0, 0, false},
	{"no prompt count", `{"usage":{"completion_tokens":3,"total_tokens":3}}`, 0, 0, false},
	{"cut off", `{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tok`, 0, 0, false},
	{"cut after", `{"usage":{"prompt_tokens":100`, 0, 0, false},
	{"negative", `{"usage":{"prompt_tokens":-5}}`, 0, 0, false},
	{"string count", `{"usage":{"prompt_tokens":"5"}}`, 0, 0, false},
	{"cached over prompt", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":99}}}`, 10, 10, true},
	{"negative cached", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":-3}}}`, 10, 0, true},
	{"fraction", `{"usage":{"prompt_tokens":12.0,"prompt_tokens_details":{"cached_tokens":1e1}}}`, 12, 1, true},
	{"huge", `{"usage":{"prompt_tokens":99999999999999999999999999,"prompt_tokens_details":{"cached_tokens":99999999999999999999999999}}}`, maxTokens, maxTokens, true},
	{"nested unknowns", `{"usage":{"x":{"a":[1,{"b":"}]"}],"c":"\\\""},"prompt_tokens":8,"y":[[],{}],"prompt_tokens_details":{"z":{"cached_tokens":99},"cached_tokens":4}}}`, 8, 4, true},
	{"empty", ``, 0, 0, false},
	{"not json", `usage usage "usage" "usage":`, 0, 0, false},
}

func TestScanUsage(t *testing.T) {
	for _, c := range usageCases {
		prompt, cached, ok := scanUsage([]byte(c.body))
		if prompt != c.prompt || cached != c.cached || ok != c.ok {
			t.Errorf("%s: scanUsage = %d, %d, %v; want %d, %d, %v", c.name, prompt, cached, ok, c.prompt, c.cached, c.ok)
		}
	}
}

func TestScanUsageAllocatesNothing(t *testing.T) {
	body := []byte(usageCases[0].body)
	if n := testing.AllocsPerRun(100, func() { scanUsage(body) }); n != 0 {
		t.Fatalf("scanUsage allocates %.1f times", n)
	}
}

// FuzzUsage: the scanner never panics, its counts are never negative, the
// cached ones never exceed the prompt, and a body that encoding/json reads
// as an object with a usage object gets the counts that encoding/json
// finds.
func FuzzUsage(f *testing.F) {
	for _, c := range usageCases {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := lastUsageKey(b), bytes.LastIndex(b, []byte(strUsageKey)); got != want {
			t.Fatalf("the last of nextUsageKey(%q) = %d, bytes.LastIndex's %d", b, got, want)
		}
		prompt, cached, ok := scanUsage(b)
		if prompt < 0 || cached < 0 || cached > prompt || prompt > maxTokens {
			t.Fatalf("scanUsage(%q) = %d, %d, %v", b, prompt, cached, ok)
		}
		if !ok && (prompt != 0 || cached != 0) {
			t.Fatalf("scanUsage(%q) = %d, %d, false", b, prompt, cached)
		}
		var v struct {
			Usage *struct {
				PromptTokens        *int64 `json:"prompt_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		// Only plain cases are compared: encoding/json also matches keys
		// case-insensitively and through \u escapes, reads -0 as 0, and
		// merges repeated objects.
		if !bytes.Equal(bytes.ToLower(b), b) || bytes.Contains(b, []byte(`\u`)) || bytes.Contains(b, []byte(`-`)) ||
			bytes.Count(b, []byte(strUsageKey)) != 1 || bytes.Contains(b, []byte(`"input_tokens`)) || bytes.Count(b, []byte(`"prompt_tokens`)) > 2 {
			return
		}
		if json.Unmarshal(b, &v) != nil || v.Usage == nil || v.Usage.PromptTokens == nil || *v.Usage.PromptTokens > maxTokens {
			return
		}
		want := *v.Usage.PromptTokens
		wantCached := int64(0)
		if d := v.Usage.PromptTokensDetails; d != nil && d.CachedTokens > 0 {
			wantCached = min(d.CachedTokens, want)
		}
		if !ok || prompt != want || cached != wantCached {
			t.Fatalf("scanUsage(%q) = %d, %d, %v; encoding/json reads %d, %d", b, prompt, cached, ok, want, wantCached)
		}
	})
}

// lastUsageKey is the last key that nextUsageKey finds, as scanUsage goes
// through them.
func lastUsageKey(b []byte) int {
	last := -1
	for i := nextUsageKey(b, 0); i >= 0; i = nextUsageKey(b, i+1) {
		last = i
	}
	return last
}

// nextUsageKey finds every "usage" wherever it is: at every offset from
// a body's start and end, among 'u's and 's's that begin no key, and
// overlapping one.
func TestNextUsageKey(t *testing.T) {
	for i := 0; i < 120; i++ {
		n, pad := i/3, []string{"x", "u", "s"}[i%3]
		for at := 0; at <= n; at++ {
			b := []byte(strings.Repeat(pad, at) + strUsageKey + strings.Repeat("x", n-at))
			if got := lastUsageKey(b); got != at {
				t.Fatalf("lastUsageKey(%q) = %d, want %d", b, got, at)
			}
			b = bytes.ReplaceAll(b, []byte(strUsageKey), []byte(`"usagE"`))
			if got := lastUsageKey(b); got != -1 {
				t.Fatalf("lastUsageKey(%q) = %d, want -1", b, got)
			}
		}
	}
	for _, tc := range []struct {
		b    string
		want int
	}{
		{`"usage""usage"usage"x`, 13}, // the third starts at the second's closing quote
		{`"usage"xusage"`, 0},         // usage" without its quote is no key
		{`usage"`, -1},
		{`"usage`, -1},
	} {
		if got := lastUsageKey([]byte(tc.b)); got != tc.want {
			t.Fatalf("lastUsageKey(%q) = %d, want %d", tc.b, got, tc.want)
		}
	}
}

// The ring keeps the last usageWindow bytes relayed, however the stream
// is cut into reads.
func TestUsageTailRing(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, total := range []int{0, 1, 100, usageWindow - 1, usageWindow, usageWindow + 1, 3*usageWindow + 17, 20_000} {
		stream := make([]byte, total)
		for i := range stream {
			stream[i] = byte('a' + rng.IntN(26))
		}
		for try := 0; try < 20; try++ {
			x := &exchange{buffers: buffers{tail: make([]byte, usageWindow)}}
			for rest := stream; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(2*usageWindow))
				if try%2 == 0 {
					n = min(len(rest), 1+rng.IntN(64))
				}
				x.keepTail(rest[:n])
				rest = rest[n:]
			}
			want := stream[max(0, total-usageWindow):]
			if got := x.streamTail(); !bytes.Equal(got, want) {
				t.Fatalf("%d bytes: tail %q, want %q", total, got, want)
			}
		}
	}
}

// usageReplica answers a non-streamed chat completion with the given usage
// object, or a stream of events, each flushed on its own, with filler
// content so that the stream is several times the tail's window, and the
// usage chunk (split in two flushes) before data: [DONE] when usage is set.
func usageReplica(usage string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		var body bytes.Buffer
		body.ReadFrom(r.Body)
		json.Unmarshal(body.Bytes(), &req)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"usage"},"finish_reason":"stop"}]%s}`, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < 40; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", strings.Repeat("tok ", 30))
			fl.Flush()
		}
		if usage != "" {
			chunk := `data: {"id":"x","object":"chat.completion.chunk","choices":[]` + usage + "}\n\n"
			half := len(chunk) / 2
			fmt.Fprint(w, chunk[:half])
			fl.Flush()
			time.Sleep(5 * time.Millisecond)
			fmt.Fprint(w, chunk[half:])
			fl.Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// Through a real proxy: a non-streamed answer and a stream with
// include_usage move the prompt token counters by exactly what the replica
// reported, under the request's replica and reason; a stream without usage
// moves nothing; /replicas gives the totals and the hit ratio.
func TestUsageCountedThroughProxy(t *testing.T) {
	const usage = `,"usage":{"prompt_tokens":1000,"total_tokens":1010,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":640}}`
	withUsage := startReplica(t, "a", usageReplica(usage))
	without := startReplica(t, "b", usageReplica(""))
	p := startProxy(t, RoundRobin, []string{withUsage.url(), without.url()})
	series := func(addr, result string) string {
		return `warmroute_prompt_tokens_total{replica="` + addr + `",reason="spread",result="` + result + `"}`
	}
	// finish counts usage before the request: once the request is
	// counted, its usage is too.
	waitRequests := func(addr, n string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); p.metric(t, `warmroute_requests_total{replica="`+addr+`",reason="spread",class="2xx"}`) != n; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: requests_total %s, want %s", addr, p.metric(t, `warmroute_requests_total{replica="`+addr+`",reason="spread",class="2xx"}`), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	check := func(step, addr, cached, computed string) {
		t.Helper()
		if got := p.metric(t, series(addr, "cached")); got != cached {
			t.Errorf("%s: cached %s, want %s", step, got, cached)
		}
		if got := p.metric(t, series(addr, "computed")); got != computed {
			t.Errorf("%s: computed %s, want %s", step, got, computed)
		}
	}
	check("startup", withUsage.addr, "0", "0")
	check("startup", without.addr, "0", "0")

	streamed := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	plain := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	// Round robin: the requests alternate a, b, a, b.
	for i, body := range []string{plain, plain, streamed, streamed} {
		r := post(p, "/v1/chat/completions", body)
		if r.err != nil || r.status != 200 || r.route != "spread" {
			t.Fatalf("request %d: %v %d %q %s", i, r.err, r.status, r.route, r.body)
		}
		if i >= 2 && !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
			t.Fatalf("request %d: the stream was not relayed whole: %q", i, r.body[max(0, len(r.body)-200):])
		}
	}
	waitRequests(withUsage.addr, "2")
	waitRequests(without.addr, "2")
	check("a JSON answer and a stream with usage", withUsage.addr, "1280", "720")
	check("no usage", without.addr, "0", "0")

	rec := httptest.NewRecorder()
	p.h.Admin(false).ServeHTTP(rec, httptest.NewRequest("GET", "/replicas", nil))
	var status struct {
		Replicas []replicaStatus `json:"replicas"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &status); err != nil {
		t.Fatalf("/replicas: %v %s", err, rec.Body)
	}
	for _, row := range status.Replicas {
		switch row.Name {
		case withUsage.addr:
			if row.PromptTokens != 2000 || row.CachedTokens != 1280 || row.HitRatio == nil || *row.HitRatio != 0.64 {
				t.Errorf("/replicas row %s", rec.Body)
			}
		case without.addr:
			if row.PromptTokens != 0 || row.CachedTokens != 0 || row.HitRatio != nil {
				t.Errorf("/replicas row %s", rec.Body)
			}
		}
	}
	if !strings.Contains(rec.Body.String(), `"hit_ratio": 0.64`) || !strings.Contains(rec.Body.String(), `"hit_ratio": null`) {
		t.Errorf("/replicas: %s", rec.Body)
	}
}

// The estimate's error goes to the side it fell on, and only when the
// policy made a prediction.
func TestUsageEstimateErrorMetrics(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	m := p.h.m
	m.promptTokens(0, Pinned, 1000, 640, -1)  // no prediction
	m.promptTokens(0, Pinned, 1000, 640, 640) // exact
	m.promptTokens(0, Pinned, 1000, 640, 600) // under by 40
	m.promptTokens(0, Pinned, 1000, 0, 960)   // over by 960
	for series, want := range map[string]string{
		`warmroute_prompt_tokens_total{replica="` + a.addr + `",reason="pinned",result="cached"}`:   "1920",
		`warmroute_prompt_tokens_total{replica="` + a.addr + `",reason="pinned",result="computed"}`: "2080",
		`warmroute_cached_tokens_estimate_error_count{side="under"}`:                                "2",
		`warmroute_cached_tokens_estimate_error_sum{side="under"}`:                                  "40",
		`warmroute_cached_tokens_estimate_error_bucket{side="under",le="0"}`:                        "1",
		`warmroute_cached_tokens_estimate_error_bucket{side="under",le="64"}`:                       "2",
		`warmroute_cached_tokens_estimate_error_count{side="over"}`:                                 "1",
		`warmroute_cached_tokens_estimate_error_sum{side="over"}`:                                   "960",
		`warmroute_cached_tokens_estimate_error_bucket{side="over",le="256"}`:                       "0",
		`warmroute_cached_tokens_estimate_error_bucket{side="over",le="1024"}`:                      "1",
	} {
		if got := p.metric(t, series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
}

// BenchmarkUsageBody is the usage's cost to a non-streamed answer: the
// search of its tail and the read of the usage object.
func BenchmarkUsageBody(b *testing.B) {
	body := []byte(usageCases[0].body)
	b.ReportAllocs()
	for b.Loop() {
		if p, _, ok := scanUsage(body); !ok || p != 1000 {
			b.Fatal(p, ok)
		}
	}
}

// BenchmarkUsageStream is its cost to a stream of 16 token events and a
// usage chunk (BenchmarkProxySSE's): one copy into the ring per read, and
// the ring rotated and searched once at the end.
// BenchmarkUsageStreamWithout searches a stream's tail that holds no usage,
// as most clients' streams do (they do not ask for include_usage): the
// whole window is searched.
func BenchmarkUsageStreamWithout(b *testing.B) {
	event := []byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"},\"finish_reason\":null}]}\n\n")
	tail := bytes.Repeat(event, usageWindow/len(event)+1)[:usageWindow]
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := scanUsage(tail); ok {
			b.Fatal("usage found where there is none")
		}
	}
}

// BenchmarkUsageManyKeys searches a tail full of "usage" strings that are
// no member, as a model that repeats them could make: one pass, however
// many there are.
func BenchmarkUsageManyKeys(b *testing.B) {
	tail := bytes.Repeat([]byte(`:"usage"`), usageWindow/8)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := scanUsage(tail); ok {
			b.Fatal("usage found where there is none")
		}
	}
}

func BenchmarkUsageStream(b *testing.B) {
	event := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n")
	last := []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":96,\"total_tokens\":112,\"completion_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":80}}}\n\ndata: [DONE]\n\n")
	x := &exchange{buffers: buffers{tail: make([]byte, usageWindow)}}
	b.ReportAllocs()
	for b.Loop() {
		x.stream.tailed = 0
		for range 16 {
			x.keepTail(event)
		}
		x.keepTail(last)
		if p, _, ok := scanUsage(x.streamTail()); !ok || p != 96 {
			b.Fatal(p, ok)
		}
	}
}

// BenchmarkUsageLongStream is a long answer's: 2000 events, the ring
// wrapped many times.
func BenchmarkUsageLongStream(b *testing.B) {
	event := []byte("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n")
	last := []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":96,\"total_tokens\":112,\"completion_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":80}}}\n\ndata: [DONE]\n\n")
	x := &exchange{buffers: buffers{tail: make([]byte, usageWindow)}}
	b.ReportAllocs()
	for b.Loop() {
		x.stream.tailed = 0
		for range 2000 {
			x.keepTail(event)
		}
		x.keepTail(last)
		if p, _, ok := scanUsage(x.streamTail()); !ok || p != 96 {
			b.Fatal(p, ok)
		}
	}
}

// BenchmarkStreamTail is the tail's rotation at the end of a stream that
// did not end on the ring's boundary.
func BenchmarkStreamTail(b *testing.B) {
	x := &exchange{buffers: buffers{tail: make([]byte, usageWindow)}}
	chunk := bytes.Repeat([]byte("data: {}\n\n"), 37)
	for b.Loop() {
		x.stream.tailed = 0
		for range 7 {
			x.keepTail(chunk)
		}
		x.streamTail()
	}
}

// readNameByBytes is readName as a loop over bytes, the reference.
func readNameByBytes(b []byte, i int) ([]byte, int) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return b[i+1 : j], j + 1
		}
	}
	return nil, -1
}

func FuzzReadName(f *testing.F) {
	for _, s := range []string{`"a"`, `"a\"b"`, `"a\\"`, `"a\\\"b"x"`, `"\\\\\\"`, `"`, `"abc`, `"a\"`, `""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || b[0] != '"' {
			return
		}
		name, next := readName(b, 0)
		wantName, wantNext := readNameByBytes(b, 0)
		if next != wantNext || !bytes.Equal(name, wantName) {
			t.Fatalf("readName(%q) = %q, %d; want %q, %d", b, name, next, wantName, wantNext)
		}
	})
}

// The usage at the end of a whole answer far larger than the usage window
// is counted, and the access log has the answer's bytes.
func TestUsageOfALargeWholeAnswer(t *testing.T) {
	usage := `"usage":{"prompt_tokens":1000,"total_tokens":1010,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":640}}}`
	big := `{"id":"x","choices":[{"message":{"content":"` + strings.Repeat("z", 5*usageWindow) + `"}}],` + usage
	url := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(big)) + "\r\n\r\n" + big)
	})
	p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.AccessLog = true })
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 || r.body != big {
		t.Fatalf("%d, %d bytes", r.status, len(r.body))
	}
	waitFor(t, "the access log line", func() bool { return p.logs.count("request") == 1 })
	if prompt, cached := p.h.m.replicaTokens(0); prompt != 1000 || cached != 640 {
		t.Errorf("usage %d prompt tokens, %d cached; want 1000 and 640", prompt, cached)
	}
	if logs := p.logs.String(); !strings.Contains(logs, fmt.Sprintf("bytes=%d", len(big))) {
		t.Errorf("access log without bytes=%d:\n%s", len(big), logs)
	}
}
