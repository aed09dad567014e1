package prefixcache

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

const baseConversation = `{"model":"qwen","messages":[
 {"role":"system","content":"You are a coder. Café/bar."},
 {"role":"user","content":[{"type":"text","text":"read main.go"}]},
 {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"main.go\"}"}}]},
 {"role":"tool","tool_call_id":"c1","content":"package main"},
 {"role":"user","content":"now fix it","name":"ann"}
],"stream":true}`

func chainOf(t *testing.T, body string) []Link {
	t.Helper()
	c, err := appendChain(nil, []byte(body))
	if err != nil {
		t.Fatalf("appendChain(%s): %v", body, err)
	}
	return c
}

func TestSpellingsShareOneChain(t *testing.T) {
	want := chainOf(t, baseConversation)
	if len(want) != 5 {
		t.Fatalf("got %d links, want 5", len(want))
	}
	spellings := map[string]string{
		"key order": `{"stream":true,"messages":[
 {"content":"You are a coder. Café/bar.","role":"system"},
 {"content":[{"text":"read main.go","type":"text"}],"role":"user"},
 {"tool_calls":[{"function":{"arguments":"{\"path\":\"main.go\"}","name":"read"},"type":"function","id":"c1"}],"role":"assistant","content":null},
 {"content":"package main","tool_call_id":"c1","role":"tool"},
 {"name":"ann","content":"now fix it","role":"user"}
],"model":"qwen"}`,
		"escapes":    strings.NewReplacer(`Café/bar`, `Caf\u00e9\/bar`, `"role"`, `"\u0072ole"`, `now fix`, `n\u006fw fix`).Replace(baseConversation),
		"whitespace": strings.NewReplacer("\n", "", `":"`, `" :  "`, `,"`, ` ,	"`).Replace(baseConversation),
		"null keys":  strings.Replace(baseConversation, `"role":"system"`, `"role":"system","name":null`, 1),
	}
	for name, body := range spellings {
		got := chainOf(t, body)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: chain differs\n got %x\nwant %x", name, got, want)
		}
	}
}

// A string hashes as its canonical spelling (strCanon): its escapes that
// are not that spelling (\/, \u) are spelled anew, so that each pair below
// hashes alike or apart as its two strings are one or two; the long ones go
// through the block search.
func TestCanonicalSpelling(t *testing.T) {
	long := strings.Repeat(`x\n`, 40)
	for _, tt := range []struct {
		a, b string
		same bool
	}{
		{`"a\/b"`, `"a/b"`, true},
		{`"\u0041"`, `"A"`, true},
		{`"\u000a"`, `"\n"`, true},
		{`"\u000A\u0009\u000d\u0008\u000c"`, `"\n\t\r\b\f"`, true},
		{`"\u0022\u005c"`, `"\"\\"`, true},
		{`"\u003cdiv\u003e \u0026"`, `"<div> &"`, true},
		{`"\u00e9\ud83d\ude00"`, `"é😀"`, true},
		{`"` + long + `\u0041` + long + `"`, `"` + long + `A` + long + `"`, true},
		{`"` + long + `\/` + long + `\u000a"`, `"` + long + `/` + long + `\n"`, true},
		{`"\\n"`, `"\n"`, false},
		{`"n"`, `"\n"`, false},
		{`"\\"`, `"\u005c\u005c"`, false},
		{`"` + long + `"`, `"` + long + `\n"`, false},
		{`"` + long + `\\n"`, `"` + long + `\n"`, false},
	} {
		sa, sb := scanner{b: []byte(tt.a + tail)}, scanner{b: []byte(tt.b + tail)}
		ha, na := sa.str()
		hb, nb := sb.str()
		if sa.err != nil || sb.err != nil {
			t.Fatalf("%s / %s: %v / %v", tt.a, tt.b, sa.err, sb.err)
		}
		if (ha == hb) != tt.same || tt.same && na != nb {
			t.Errorf("%s / %s: hashes %x / %x, decoded lengths %d / %d; want them the same: %v", tt.a, tt.b, ha, hb, na, nb, tt.same)
		}
	}
}

func TestSurrogatePairsDecode(t *testing.T) {
	a := chainOf(t, `{"messages":[{"role":"user","content":"\ud83d\ude00 \u00E9"}]}`)
	b := chainOf(t, `{"messages":[{"role":"user","content":"😀 é"}]}`)
	if a[0] != b[0] {
		t.Fatalf("escaped and raw emoji differ: %x %x", a, b)
	}
	c := chainOf(t, `{"messages":[{"role":"user","content":"\ud83d x"}]}`)
	d := chainOf(t, `{"messages":[{"role":"user","content":"`+string(utf8.RuneError)+` x"}]}`)
	if c[0] != d[0] {
		t.Fatalf("unpaired surrogate does not decode to U+FFFD")
	}
}

// Each change must keep the links before the changed message and break every
// link from it on.
func TestChangesBreakTheChainWhereTheyHappen(t *testing.T) {
	base := chainOf(t, baseConversation)
	tests := []struct {
		name, old, new string
		first          int // first link that must change
	}{
		{"role", `"role":"user","content":"now`, `"role":"system","content":"now`, 4},
		{"content string", `package main`, `package lib`, 3},
		{"content part", `read main.go`, `read main.rs`, 1},
		{"content part type", `"type":"text"`, `"type":"input_text"`, 1},
		{"name", `"name":"ann"`, `"name":"bob"`, 4},
		{"name added", `"role":"system"`, `"role":"system","name":"x"`, 0},
		{"tool_calls", `main.go\"}`, `main.rs\"}`, 2},
		{"tool_call id", `"id":"c1"`, `"id":"c2"`, 2},
		{"tool_call_id", `"tool_call_id":"c1"`, `"tool_call_id":"c9"`, 3},
		{"content string vs parts", `"content":"package main"`, `"content":[{"type":"text","text":"package main"}]`, 3},
		{"model", `"model":"qwen"`, `"model":"llama"`, 0},
		{"tools", `"stream":true`, `"stream":true,"tools":[{"type":"function","function":{"name":"read"}}]`, 0},
		{"number vs string", `"tool_call_id":"c1"`, `"tool_call_id":1`, 3},
		{"stream does not matter", `"stream":true`, `"stream":false,"temperature":0.2`, 5},
	}
	for _, tt := range tests {
		body := strings.Replace(baseConversation, tt.old, tt.new, 1)
		if body == baseConversation {
			t.Fatalf("%s: replacement did not apply", tt.name)
		}
		got := chainOf(t, body)
		for i := range base {
			same := got[i] == base[i]
			if i < tt.first && !same {
				t.Errorf("%s: link %d changed, want unchanged before %d", tt.name, i, tt.first)
			}
			if i >= tt.first && same {
				t.Errorf("%s: link %d unchanged, want changed from %d on", tt.name, i, tt.first)
			}
		}
	}
}

func TestPrefixesOfOneConversationShareLinks(t *testing.T) {
	turn1 := chainOf(t, `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q1"}]}`)
	turn2 := chainOf(t, `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}`)
	if turn1[1] != turn2[1] || turn1[0] != turn2[0] {
		t.Fatalf("turn 2 does not extend turn 1: %x %x", turn1, turn2)
	}
}

func TestBadInput(t *testing.T) {
	tests := []struct {
		body string
		want error
	}{
		{``, ErrMalformed},
		{`[]`, ErrMalformed},
		{`{}`, ErrNotChat},
		{`{"prompt":"hi"}`, ErrNotChat},
		{`{"messages":"hi"}`, ErrNotChat},
		{`{"messages":[]}`, nil},
		{`{"messages":[{"role":"user"}]`, ErrMalformed},
		{`{"messages":[{"role":"user"}]} x`, ErrMalformed},
		{`{"messages":[{"role":"us`, ErrMalformed},
		{`{"messages":[{"role":"\x"}]}`, ErrMalformed},
		{`{"messages":[{"role":"\u12"}]}`, ErrMalformed},
		{`{"messages":[{"role":tru}]}`, ErrMalformed},
		{`{"messages":[{"role" "user"}]}`, ErrMalformed},
		{`{"messages":[1,]}`, ErrMalformed},
		{`{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `,"messages":[]}`, ErrTooDeep},
	}
	for _, tt := range tests {
		dst := []Link{{1, 2}}
		got, err := appendChain(dst, []byte(tt.body))
		if !errors.Is(err, tt.want) {
			t.Errorf("appendChain(%q) error = %v, want %v", tt.body, err, tt.want)
		}
		if err != nil && len(got) != 1 {
			t.Errorf("appendChain(%q) extended dst on error", tt.body)
		}
	}
}

// respell writes v as JSON with keys in reverse order, every non-ASCII rune,
// control byte and letter 'a' escaped as \u, every '/' as \/, and extra
// whitespace: a different spelling of the same meaning.
func respell(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Sort(sort.Reverse(sort.StringSlice(keys)))
		b.WriteString("{ ")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(" ,\n")
			}
			respellString(b, k)
			b.WriteString(" : ")
			respell(b, v[k])
		}
		b.WriteString(" }")
	case []any:
		b.WriteString("[ ")
		for i, e := range v {
			if i > 0 {
				b.WriteString(" , ")
			}
			respell(b, e)
		}
		b.WriteString(" ]")
	case string:
		respellString(b, v)
	default:
		out, _ := json.Marshal(v)
		b.Write(out)
	}
}

func respellString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == 'a' || r >= 0x80 && r < 0x10000:
			fmt.Fprintf(b, `\u%04x`, r)
		case r == '/':
			b.WriteString(`\/`) // the one-byte escape; 'a' tests \u
		case r >= 0x10000:
			r -= 0x10000
			fmt.Fprintf(b, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

func FuzzCanonical(f *testing.F) {
	f.Add([]byte(baseConversation))
	f.Add([]byte(`{"messages":[{"role":"user","content":"\ud83d\ude00"}],"model":"x"}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:"}}]}]}`))
	f.Add([]byte(`{"messages":[1,"a",null,true,[-1.5e3]]}`))
	f.Add([]byte(`{"model":"m","prompt":"def f():\n\treturn \"\u00e9\" # a prompt long enough for chunks"}`))
	f.Add([]byte(`{"prompt":[1,2,3,4,5,6,7,8,9,10]}`))
	f.Add([]byte(`{"prompt_cache_key":"s\u00e9ssion\/7","messages":[{"role":"user","content":"hi"}],"prompt_cache_key":"a\"b"}`))
	f.Add(workload.Body("m", []workload.Message{{Role: "user", Content: workload.Text(1, 300)}, {Role: "tool", Content: workload.Text(2, 200)}}, false, 8))
	f.Fuzz(func(t *testing.T, body []byte) {
		chain, err := appendChain(nil, body) // must not panic
		// Trailing spaces change nothing, but give strCanon room for
		// whole blocks in every string of a short body, where without
		// them it decodes sixteen bytes at a time or one.
		padded := append(body[:len(body):len(body)], strings.Repeat(" ", 300)...)
		pchain, perr := appendChain(nil, padded)
		if !errors.Is(perr, err) || fmt.Sprint(pchain) != fmt.Sprint(chain) {
			t.Fatalf("trailing spaces change the chain: %x (%v) / %x (%v)\n%s", chain, err, pchain, perr, body)
		}
		if err != nil || !json.Valid(body) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return
		}
		// encoding/json keeps the last of duplicate keys; the canonical
		// form keeps both, so compare only spellings made from v.
		std, _ := json.Marshal(v)
		var alt bytes.Buffer
		respell(&alt, v)
		a, errA := appendChain(nil, std)
		b, errB := appendChain(nil, alt.Bytes())
		if !errors.Is(errA, errB) {
			t.Fatalf("errors differ: %v / %v\n%s\n%s", errA, errB, std, alt.Bytes())
		}
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("spellings differ:\n%s\n%s", std, alt.Bytes())
		}
		if len(a) != len(chain) {
			t.Fatalf("respelled body has %d links, original %d", len(a), len(chain))
		}
		// The same for both chains with links every 8 bytes.
		var ca, cb Chains
		errA, errB = ca.Read(std, 8), cb.Read(alt.Bytes(), 8)
		if !errors.Is(errA, errB) || fmt.Sprint(ca) != fmt.Sprint(cb) {
			t.Fatalf("chains in chunks differ across spellings:\n%s\n%s", std, alt.Bytes())
		}
		// The session key is the last top-level prompt_cache_key, keyed
		// as its decoded string is, however it is spelled.
		var want uint64
		if key, ok := v.(map[string]any)["prompt_cache_key"].(string); ok && key != "" {
			want = ModelKey(key)
		}
		if ca.CacheKey != want {
			t.Fatalf("cache key %x, want %x:\n%s", ca.CacheKey, want, std)
		}
	})
}

// The model's key is the same however the body spells the name, whatever
// the request (chat or not), and only a string is a model.
func TestChainsModel(t *testing.T) {
	want := ModelKey("llama-8b")
	for _, tt := range []struct {
		body string
		key  uint64
		err  error
	}{
		{`{"model":"llama-8b","messages":[{"role":"user","content":"hi"}]}`, want, nil},
		{`{"messages":[{"role":"user","content":"hi"}],"model":"llama\u002d8b"}`, want, nil},
		{`{"model":"llama-8b","prompt":"once upon a time"}`, want, ErrNotChat},
		{`{"prompt":"x","tools":[{"model":"llama-8b"}]}`, 0, ErrNotChat},
		{`{"model":7,"prompt":"x"}`, 0, ErrNotChat},
		{`{"model":"qwen-32b","prompt":"x"}`, ModelKey("qwen-32b"), ErrNotChat},
		{`{"model":"llama-8b"`, 0, ErrMalformed},
	} {
		_, key, err := appendChainModel(nil, []byte(tt.body))
		if key != tt.key || err != tt.err {
			t.Errorf("%s: key %x, %v; want %x, %v", tt.body, key, err, tt.key, tt.err)
		}
	}
	if ModelKey("qwen-32b") == want {
		t.Fatal("two models share a key")
	}
}

// prompt_cache_key names a session (chat completions and Responses alike):
// its key is the decoded string's however it is spelled, read at the top
// level only (Anthropic's metadata.user_id spans a user's sessions), and it
// changes no link, since the engine's cache does not see it.
func TestChainsCacheKey(t *testing.T) {
	want := ModelKey("sess-1")
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tt := range []struct {
		body string
		key  uint64
		err  error
	}{
		{`{"model":"m","prompt_cache_key":"sess-1",` + msgs + `}`, want, nil},
		{`{` + msgs + `,"prompt_cache_key":"s\u0065ss-1"}`, want, nil},
		{`{"model":"m","input":"hi","prompt_cache_key":"sess-1"}`, want, nil},
		{`{"model":"m","prompt":"once","prompt_cache_key":"sess-1"}`, want, nil},
		{`{"model":"m","prompt_cache_key":"sess-1"}`, want, ErrNotChat},
		{`{"prompt_cache_key":"sess-2",` + msgs + `}`, ModelKey("sess-2"), nil},
		{`{"prompt_cache_key":"sess-2",` + msgs + `,"prompt_cache_key":"sess-1"}`, want, nil},
		{`{"prompt_cache_key":"sess-1",` + msgs + `,"prompt_cache_key":null}`, 0, nil},
		{`{"prompt_cache_key":"",` + msgs + `}`, 0, nil},
		{`{"prompt_cache_key":7,` + msgs + `}`, 0, nil},
		{`{"metadata":{"user_id":"sess-1","prompt_cache_key":"sess-1"},` + msgs + `}`, 0, nil},
		{`{` + msgs[:len(msgs)-2] + `,"prompt_cache_key":"sess-1"}]}`, 0, nil},
		{`{"prompt_cache_key":"sess-1",` + msgs, 0, ErrMalformed},
	} {
		var c Chains
		if err := c.Read([]byte(tt.body), 64); c.CacheKey != tt.key || err != tt.err {
			t.Errorf("%s: key %x, %v; want %x, %v", tt.body, c.CacheKey, err, tt.key, tt.err)
		}
	}
	var with, without Chains
	with.Read([]byte(`{"model":"m","prompt_cache_key":"sess-1",`+msgs+`}`), 8)
	without.Read([]byte(`{"model":"m",`+msgs+`}`), 8)
	if fmt.Sprint(with.Messages, with.Blocks) != fmt.Sprint(without.Messages, without.Blocks) {
		t.Error("prompt_cache_key changed the chains")
	}
}

// vLLM's cache_salt keeps requests from sharing KV blocks: chains with
// different salts share no link, with the same salt they are one.
func TestCacheSaltSeedsTheChain(t *testing.T) {
	body := func(salt string) []byte {
		return []byte(`{"model":"m",` + salt + `"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`)
	}
	a, _ := appendChain(nil, body(`"cache_salt":"tenant-a",`))
	b, _ := appendChain(nil, body(`"cache_salt":"tenant-b",`))
	a2, _ := appendChain(nil, body(`"cache_salt":"tenant\u002da",`))
	none, _ := appendChain(nil, body(""))
	for i := range a {
		if a[i] == b[i] || a[i] == none[i] {
			t.Fatalf("link %d shared across salts", i)
		}
		if a[i] != a2[i] {
			t.Fatalf("link %d differs for one salt spelled two ways", i)
		}
	}
}

// A completions prompt makes one link per chunk of its canonical spelling:
// a prompt that extends another shares every link of the shorter one,
// however it is spelled; token ids chunk by count, and a batch makes no
// chain.
func TestPromptChain(t *testing.T) {
	long := strings.Repeat("def f(x):\n    return \"x\"\n", 200) // escapes every few bytes
	body := func(prompt string) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt})
		return b
	}
	// rendered is the length of the canonical spelling of s.
	rendered := func(s string) int {
		q, _ := json.Marshal(s)
		c, ok := canonicalReference(q)
		if !ok {
			t.Fatalf("no canonical spelling of %q", s)
		}
		return len(c)
	}
	n := rendered(long)
	if n <= len(long) {
		t.Fatalf("the prompt's canonical spelling has %d bytes, want escapes beyond its %d", n, len(long))
	}
	a, _, errA := appendRequestChain(nil, body(long), 256)
	b, _, errB := appendRequestChain(nil, body(long+"more text that extends the prompt, and then some"), 256)
	if errA != nil || errB != nil || len(a) != n/256 || len(b) < len(a) {
		t.Fatalf("links %d and %d (%v %v), want %d for the first", len(a), len(b), errA, errB, n/256)
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("link %d differs for a prompt that extends the other", i)
		}
	}
	// Another spelling of the same prompt: escapes for every ASCII letter e.
	respelled := bytes.ReplaceAll(body(long), []byte("e"), []byte(`\u0065`))
	c, _, _ := appendRequestChain(nil, respelled, 256)
	if fmt.Sprint(c) != fmt.Sprint(a) {
		t.Fatal("a respelled prompt made another chain")
	}
	// Changing one byte in the middle breaks the chain there, not before.
	mid := []byte(long)
	mid[len(long)/2] = '#'
	d, _, _ := appendRequestChain(nil, body(string(mid)), 256)
	k := rendered(long[:len(long)/2]) / 256
	if d[k-1] != a[k-1] || d[k] == a[k] {
		t.Fatalf("a change at byte %d: link %d must match, link %d must not", len(long)/2, k-1, k)
	}
	tokens := make([]int, 600)
	for i := range tokens {
		tokens[i] = i * 7
	}
	tb, _ := json.Marshal(map[string]any{"model": "m", "prompt": tokens})
	if tc, _, err := appendRequestChain(nil, tb, 256); err != nil || len(tc) != 600/promptTokensChunk {
		t.Fatalf("token ids: %d links, %v", len(tc), err)
	}
	if bc, _, err := appendRequestChain(nil, []byte(`{"model":"m","prompt":["a","b"]}`), 256); err != ErrNotChat || len(bc) != 0 {
		t.Fatalf("a batch of prompts: %d links, %v", len(bc), err)
	}
	if _, key, err := appendRequestChain(nil, body("short"), 256); err != nil || key != ModelKey("m") {
		t.Fatalf("a short prompt: %v, model %x", err, key)
	}
}

// Anthropic Messages: the system prompt (a string or blocks) seeds the
// chain, content blocks hash by meaning, and cache_control marks change
// nothing; a changed tool result breaks the chain at its message.
func TestAnthropicMessagesChain(t *testing.T) {
	base := `{"model":"claude","system":[{"type":"text","text":"You are a coding agent.","cache_control":{"type":"ephemeral"}}],"max_tokens":64,"messages":[
		{"role":"user","content":[{"type":"text","text":"fix the bug"}]},
		{"role":"assistant","content":[{"type":"thinking","thinking":"look at main.go","signature":"sig"},{"type":"tool_use","id":"t1","name":"read","input":{"path":"main.go"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"package main","cache_control":{"type":"ephemeral"}}]}]}`
	a, err := appendChain(nil, []byte(base))
	if err != nil || len(a) != 3 {
		t.Fatalf("%d links, %v", len(a), err)
	}
	same := strings.NewReplacer(`,"cache_control":{"type":"ephemeral"}`, "", `"max_tokens":64,`, "").Replace(base)
	b, _ := appendChain(nil, []byte(same))
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("cache_control marks changed the chain")
	}
	other, _ := appendChain(nil, []byte(strings.Replace(base, "a coding agent", "a poet", 1)))
	if other[0] == a[0] {
		t.Fatal("another system prompt shares the chain")
	}
	result, _ := appendChain(nil, []byte(strings.Replace(base, "package main", "package other", 1)))
	if result[1] != a[1] || result[2] == a[2] {
		t.Fatal("a changed tool result must break the chain at its message, not before")
	}
}

// Responses API input: items chain like messages (so a client that sends
// its whole history, store false, is pinned like chat), a string input is
// one link, and instructions seed the chain.
func TestResponsesInputChain(t *testing.T) {
	items := `[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c1","name":"ls","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"a.go"}]`
	a, errA := appendChain(nil, []byte(`{"model":"m","instructions":"be brief","input":`+items+`}`))
	b, _ := appendChain(nil, []byte(`{"input":`+items[:strings.LastIndex(items, ",{")]+`],"model":"m","instructions":"be brief"}`))
	if errA != nil || len(a) != 3 || len(b) != 2 || a[1] != b[1] {
		t.Fatalf("items: %d and %d links (%v); the shorter history must share its links", len(a), len(b), errA)
	}
	c, _ := appendChain(nil, []byte(`{"model":"m","instructions":"be verbose","input":`+items+`}`))
	if c[0] == a[0] {
		t.Fatal("other instructions share the chain")
	}
	s, err := appendChain(nil, []byte(`{"model":"m","input":"hi"}`))
	if err != nil || len(s) != 1 {
		t.Fatalf("a string input: %d links, %v", len(s), err)
	}
}

// appendRequestChain appends the Messages chain of body to dst, as tests
// compare chains.
func appendRequestChain(dst []Link, body []byte, chunk int) ([]Link, uint64, error) {
	var c Chains
	err := c.Read(body, chunk)
	return append(dst, c.Messages...), c.Model, err
}

// appendChain is appendRequestChain for a chat request, as most tests
// write one.
func appendChain(dst []Link, body []byte) ([]Link, error) {
	dst, _, err := appendRequestChain(dst, body, 0)
	return dst, err
}

func appendChainModel(dst []Link, body []byte) ([]Link, uint64, error) {
	return appendRequestChain(dst, body, 0)
}

// Renderings that must match, and ones that must not, with their checks:
// a system prompt beside the messages is the system message it stands
// for, a null one is none, and the parts of a content array stay apart.
func TestRenderingEquivalences(t *testing.T) {
	blocks := func(body string) []Link {
		t.Helper()
		var c Chains
		if err := c.Read([]byte(body), 64); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return append([]Link(nil), c.Blocks...)
	}
	long := strings.Repeat("a system prompt of some length ", 10)
	for _, c := range []struct {
		name string
		a, b string
		same bool
	}{
		{"system beside the messages", `{"system":"` + long + `","messages":[{"role":"user","content":"q"}]}`,
			`{"messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"q"}]}`, true},
		{"instructions beside a string input", `{"instructions":"` + long + `","input":"q"}`,
			`{"input":[{"role":"system","content":"` + long + `"},{"role":"user","content":"q"}]}`, true},
		{"a null system prompt", `{"system":null,"messages":[{"role":"user","content":"q"}]}`,
			`{"messages":[{"role":"user","content":"q"}]}`, true},
		{"content parts split elsewhere", `{"messages":[{"role":"user","content":["ab","c"]}]}`,
			`{"messages":[{"role":"user","content":["a","bc"]}]}`, false},
	} {
		a, b := blocks(c.a), blocks(c.b)
		if got := fmt.Sprint(a) == fmt.Sprint(b); got != c.same {
			t.Errorf("%s: chains alike %v, want %v\n%x\n%x", c.name, got, c.same, a, b)
		}
	}
}

// Objects nested deep, each with its members out of order, are read in
// time linear in their depth: read in order first and again sorted, level
// after level, they took time exponential in it (2^30 here).
func TestDeepOutOfOrderObjects(t *testing.T) {
	sorted, inOrder := `"x"`, `"x"`
	for range 30 {
		sorted = `{"content":[` + sorted + `],"role":"u"}`
		inOrder = `{"role":"u","content":[` + inOrder + `]}`
	}
	a := chainOf(t, `{"messages":[`+sorted+`]}`)
	b := chainOf(t, `{"messages":[`+inOrder+`]}`)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("key order changed the chain")
	}
}
