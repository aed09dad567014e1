package router

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// The agents' own session keys: the requests of one conversation share a
// key, a subagent's differ from its session's and from each other's, a
// header wins over the body's prompt_cache_key, and a request with neither
// (Anthropic's metadata.user_id is no session) has none.
func TestSessionOf(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name    string
		off     bool // -session-header ""
		headers []string
		body    string
		session string // requests of one session share a label; "" is none
	}{
		{"Claude Code", false, []string{"X-Claude-Code-Session-Id", "c1"}, "", "claude main"},
		{"Claude Code, the header in lower case", false, []string{"x-claude-code-session-id", "c1"}, "", "claude main"},
		{"a Claude Code subagent", false, []string{"X-Claude-Code-Session-Id", "c1", "X-Claude-Code-Agent-Id", "a1", "X-Claude-Code-Parent-Agent-Id", "p"}, "", "claude a1"},
		{"its parent does not name it", false, []string{"X-Claude-Code-Session-Id", "c1", "X-Claude-Code-Agent-Id", "a1"}, "", "claude a1"},
		{"another subagent", false, []string{"X-Claude-Code-Session-Id", "c1", "X-Claude-Code-Agent-Id", "a2"}, "", "claude a2"},
		{"another session", false, []string{"X-Claude-Code-Session-Id", "c2"}, "", "claude other"},
		{"Codex", false, []string{"Session-Id", "s1", "Thread-Id", "t1"}, `{"prompt_cache_key":"s1",` + msgs + `}`, "codex root"},
		{"a Codex subagent's thread", false, []string{"Session-Id", "s1", "Thread-Id", "t2", "X-Codex-Parent-Thread-Id", "t1"}, `{"prompt_cache_key":"s1",` + msgs + `}`, "codex child"},
		{"OpenCode", false, []string{"X-Session-Affinity", "o1", "X-Session-Id", "o1"}, "", "opencode"},
		{"one value in another header is another session", false, []string{"X-Session-Affinity", "c1"}, "", "affinity c1"},
		{"prompt_cache_key", false, nil, `{"prompt_cache_key":"c1",` + msgs + `}`, "key c1"},
		{"prompt_cache_key with header sessions off", true, []string{"X-Claude-Code-Session-Id", "c2"}, `{"prompt_cache_key":"c1",` + msgs + `}`, "key c1"},
		{"a header over prompt_cache_key", false, []string{"X-Claude-Code-Session-Id", "c1"}, `{"prompt_cache_key":"c9",` + msgs + `}`, "claude main"},
		{"metadata.user_id", false, nil, `{"metadata":{"user_id":"c1"},` + msgs + `}`, ""},
		{"an empty header", false, []string{"X-Session-ID", ""}, `{` + msgs + `}`, ""},
		{"headers off", true, []string{"X-Claude-Code-Session-Id", "c1"}, "", ""},
	}
	keys := map[string]uint64{}
	labels := map[uint64]string{}
	for _, tt := range tests {
		names := DefaultSessionHeaders
		if tt.off {
			names = nil
		}
		h := &Handler{sessions: newSessionHeaders(names)}
		var hdr fasthttp.RequestHeader
		for i := 0; i+1 < len(tt.headers); i += 2 {
			hdr.Set(tt.headers[i], tt.headers[i+1])
		}
		var c prefixcache.Chains
		if tt.body != "" {
			c.Read([]byte(tt.body), 64)
		}
		k := h.sessionOf(&hdr, &c)
		switch {
		case tt.session == "":
			if k != 0 {
				t.Errorf("%s: session %x, want none", tt.name, k)
			}
			continue
		case k == 0:
			t.Errorf("%s: no session", tt.name)
			continue
		}
		if want, ok := keys[tt.session]; ok && k != want {
			t.Errorf("%s: session %x, want %q's %x", tt.name, k, tt.session, want)
		}
		if other, ok := labels[k]; ok && other != tt.session {
			t.Errorf("%s: the key of %q", tt.name, other)
		}
		keys[tt.session], labels[k] = k, tt.session
	}
}

// Under the cost policy a session's replica counts as holding its whole
// prompt: the session stays there whatever its prompt became (a history
// the agent compacted), over a replica that holds part of it, and leaves
// only when its replica is down or busier than the whole prefill and the
// margin; a new session is placed as any request.
func TestCostWeighsSessions(t *testing.T) {
	s1 := SessionKey([]byte("s1"))
	type step struct {
		session uint64
		chain   []prefixcache.Link
		avail   uint64
		load    [3]Load
		want    int
		reason  Reason
		cached  int64
	}
	idle := [3]Load{}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a compacted history stays", []step{
			{s1, sized(1, 2, 0, 10_000), 0b111, idle, 0, Spread, 0},
			{s1, sized(1, 4, 0, 10_000), 0b111, idle, 0, Session, 20_000},
			// Rewritten: no replica holds any of it.
			{s1, sized(2, 1, 0, 3_000), 0b111, idle, 0, Session, 0},
			{s1, sized(3, 1, 0, 2_000), 0b111, idle, 0, Session, 0},
			{s1, sized(3, 3, 0, 2_000), 0b111, idle, 0, Session, 2_000},
		}},
		{"over a replica that holds a part of its prompt", []step{
			{0, sized(5, 2, 0, 10_000), 0b111, idle, 0, Spread, 0},
			{s1, sized(6, 1, 0, 1_000), 0b111, idle, 1, Spread, 0},
			// Conversation 5's first 20 KB are on replica 0.
			{s1, sized(5, 3, 0, 10_000), 0b111, idle, 1, Session, 0},
		}},
		{"while its queue is shorter than the prefill a move costs", []step{
			{s1, sized(1, 2, 0, 10_000), 0b111, idle, 0, Spread, 0},
			// A rewritten 30 KB prompt, 33 KB queued on replica 0:
			// within the margin of the 30 KB another would prefill.
			{s1, sized(2, 3, 0, 10_000), 0b111, busy(0, 33_000), 0, Session, 0},
			// 60 KB queued: it moves, and its session with it.
			{s1, sized(2, 3, 0, 10_000), 0b111, busy(0, 60_000), 1, Balanced, 0},
			{s1, sized(3, 1, 0, 1_000), 0b111, idle, 1, Session, 0},
		}},
		{"a session whose replica is down", []step{
			{s1, sized(1, 2, 0, 10_000), 0b111, idle, 0, Spread, 0},
			{s1, sized(1, 4, 0, 10_000), 0b110, idle, 2, Repinned, 0},
			{s1, sized(2, 1, 0, 1_000), 0b111, idle, 2, Session, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pins := prefixcache.NewPinMap(1024, 3)
			held := prefixcache.NewHoldings(3, 1<<20)
			var counter atomic.Uint64
			var loads Loads
			for i, s := range tt.steps {
				copy(loads[:3], s.load[:])
				req := Request{Chain: s.chain, Blocks: s.chain, Avail: upstream.Mask{s.avail}, Size: ChainSize(s.chain, 0),
					Load: &loads, Held: held, Session: s.session}
				d := Choose(Cost, req, pins, &counter)
				if d.Replica != s.want || d.Reason != s.reason || d.Cached != s.cached {
					t.Fatalf("step %d: got %d (%s, %d cached), want %d (%s, %d cached)", i, d.Replica, d.Reason, d.Cached, s.want, s.reason, s.cached)
				}
				Served(Cost, req, d.Replica, 200, pins)
				held.Insert(d.Replica, s.chain, 0)
			}
		})
	}
}

// compacting is one agent conversation through the proxy: two turns, then
// two compactions in a row, each a prompt that shares nothing with the
// one before (a summary in place of the history, under a rewritten system
// prompt), and a turn that extends the last. With two idle replicas, a
// request that nothing places goes in turn, so one of the two compactions
// lands on the other replica unless the session keeps it.
func compacting(t *testing.T, p *proxy, path string, body func(system string, turns int) string, hdr ...string) []result {
	t.Helper()
	var out []result
	for _, b := range []string{
		body("You are a coding agent.", 1),
		body("You are a coding agent.", 3),
		body("Summary of the work so far, compacted once.", 1),
		body("Summary of the work so far, compacted twice.", 1),
		body("Summary of the work so far, compacted twice.", 3),
	} {
		r := post(p, path, b, hdr...)
		if r.status != 200 {
			t.Fatalf("%s: %d %v %s", path, r.status, r.err, r.body)
		}
		out = append(out, r)
	}
	return out
}

// messagesBody is an Anthropic Messages request, as Claude Code sends it.
func messagesBody(system string, turns int) string {
	var m []string
	for i := 0; i < turns; i++ {
		m = append(m, fmt.Sprintf(`{"role":%q,"content":[{"type":"text","text":"turn %d of the task"}]}`, []string{"user", "assistant"}[i%2], i))
	}
	return `{"model":"m","max_tokens":8,"system":[{"type":"text","text":` + fmt.Sprintf("%q", system) + `}],"messages":[` + strings.Join(m, ",") + `]}`
}

// chatBody is a chat completions request that names its session with
// prompt_cache_key.
func chatBody(key string) func(system string, turns int) string {
	return func(system string, turns int) string {
		m := []string{fmt.Sprintf(`{"role":"system","content":%q}`, system)}
		for i := 0; i < turns; i++ {
			m = append(m, fmt.Sprintf(`{"role":%q,"content":"turn %d of the task"}`, []string{"user", "assistant"}[i%2], i))
		}
		return `{"model":"m",` + key + `"messages":[` + strings.Join(m, ",") + `]}`
	}
}

// A conversation whose history the agent compacts between turns stays on
// its replica under the cost policy when it carries a session key, Claude
// Code's header or prompt_cache_key, through the real handler; the same
// conversation without one is placed afresh at each compaction.
func TestCompactedSessionStays(t *testing.T) {
	tests := []struct {
		name  string
		path  string
		body  func(system string, turns int) string
		hdr   []string
		keyed bool
	}{
		{"Claude Code's session header", "/v1/messages?beta=true", messagesBody, []string{"X-Claude-Code-Session-Id", "9f1c2a7e-5d4b-4c3a-8e2f-1a2b3c4d5e6f"}, true},
		{"prompt_cache_key", "/v1/chat/completions", chatBody(`"prompt_cache_key":"conv-42",`), nil, true},
		{"no key", "/v1/chat/completions", chatBody(""), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
			p := startProxy(t, Cost, []string{a.url(), b.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
				c.SessionHeaders = DefaultSessionHeaders
			})
			rs := compacting(t, p, tt.path, tt.body, tt.hdr...)
			moved := 0
			for i, r := range rs[1:] {
				if r.replica != rs[0].replica {
					moved++
				} else if tt.keyed && r.route != "session" {
					t.Errorf("request %d kept its replica as %q, want session", i+1, r.route)
				}
			}
			switch {
			case !tt.keyed && moved == 0:
				t.Errorf("without a key, no compaction moved: the conversation tells nothing")
			case tt.keyed && moved > 0:
				t.Errorf("%d of %d later requests left the session's replica %s", moved, len(rs)-1, rs[0].replica)
			}
		})
	}
}

// Claude Code (Node's fetch) sends its header names in lower case, as
// written on the wire: they name the session as the canonical spelling does.
func TestSessionHeaderInLowerCase(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Cost, []string{a.url(), b.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
		c.SessionHeaders = DefaultSessionHeaders
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	var replicas, routes []string
	for i := range 3 { // three prompts that share nothing
		io.WriteString(c, rawChat(chat(i, 1), "x-claude-code-session-id: 9f1c2a7e\r\nx-claude-code-agent-id: a7\r\n"))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		replicas, routes = append(replicas, resp.Header.Get("X-Warmroute-Replica")), append(routes, resp.Header.Get("X-Warmroute-Route"))
	}
	if replicas[1] != replicas[0] || replicas[2] != replicas[0] || routes[1] != "session" || routes[2] != "session" {
		t.Fatalf("one session's requests went to %v (%v)", replicas, routes)
	}
}

// BenchmarkSessionOf is the cost per request of the default header list:
// a request that carries none of them (each looked up among a client's
// usual headers) and a Claude Code subagent's.
func BenchmarkSessionOf(b *testing.B) {
	h := &Handler{sessions: newSessionHeaders(DefaultSessionHeaders)}
	for _, bb := range []struct {
		name string
		hdr  []string
	}{
		{"none", nil},
		{"claude-subagent", []string{"X-Claude-Code-Session-Id", "9f1c2a7e-5d4b-4c3a-8e2f-1a2b3c4d5e6f", "X-Claude-Code-Agent-Id", "a7"}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			var hdr fasthttp.RequestHeader
			for _, kv := range [][2]string{{"User-Agent", "claude-cli/2.1.140"}, {"Authorization", "Bearer x"},
				{"Anthropic-Version", "2023-06-01"}, {"Anthropic-Beta", "claude-code-20250219"}, {"X-App", "cli"},
				{"X-Stainless-Lang", "js"}, {"X-Stainless-Os", "Linux"}, {"Accept", "application/json"}} {
				hdr.Set(kv[0], kv[1])
			}
			for i := 0; i+1 < len(bb.hdr); i += 2 {
				hdr.Set(bb.hdr[i], bb.hdr[i+1])
			}
			var c prefixcache.Chains
			b.ReportAllocs()
			for b.Loop() {
				if h.sessionOf(&hdr, &c) == 0 && bb.hdr != nil {
					b.Fatal("no session")
				}
			}
		})
	}
}
