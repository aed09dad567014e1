package router

import (
	"bytes"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/prefixcache"
)

// DefaultSessionHeaders are what -session-header lists by default: the
// headers by which coding agents name their conversations, so that those
// are read with no setting (docs/prefix-chains.md cites each one's source).
// An agent's subagent carries its session's header and one of its own
// (Claude Code's agent id, Codex's thread id), and the values of every
// listed header that a request carries name its session together: a
// subagent is a session of its own, placed by cost as any new one.
var DefaultSessionHeaders = []string{
	"X-Claude-Code-Session-Id", // Claude Code, every request of a session
	"X-Claude-Code-Agent-Id",   // Claude Code, a subagent's requests
	"Session-Id",               // Codex CLI
	"Thread-Id",                // Codex CLI, one thread (a subagent's) of a session
	"X-Session-Affinity",       // OpenCode
	"X-Session-ID",             // OpenCode, and warmroute's own
}

// sessionHeaders are the names of Config.SessionHeaders, in order, as
// the server's parser spells them; empty when header sessions are off.
type sessionHeaders [][]byte

// newSessionHeaders spells each name as fasthttp normalizes every header
// name it reads (X-Claude-Code-Session-Id for the lower-case name that
// Claude Code sends), so that a lookup is a plain comparison: PeekBytes
// normalizes its key on every call, which took most of the time of the
// six lookups a request makes (BenchmarkSessionOf).
func newSessionHeaders(names []string) sessionHeaders {
	var s sessionHeaders
	var h fasthttp.RequestHeader
	for _, n := range names {
		if n == "" {
			continue
		}
		h.Reset()
		h.Set(n, "x")
		for k := range h.All() {
			s = append(s, bytes.Clone(k))
		}
	}
	return s
}

// cacheKeySeed keeps a prompt_cache_key's session apart from a header's
// whose value spells the same.
const cacheKeySeed = 0xCAC4E_5E55_10_4E

// sessionOf returns the key of the session that a request belongs to
// (Request.Session), 0 for none: the values of the listed headers that it
// carries, each with its place in the list, or, when it carries none, the
// prompt_cache_key of its body (c.CacheKey; zero when the body was not
// read). A header names the session of any request, where the body key
// is read from chat completions and Responses bodies alone, and an agent
// that sends both (Codex) gives its subagents their own in the header.
// One header alone gives SessionKey of its value when it is listed first.
func (h *Handler) sessionOf(hdr *fasthttp.RequestHeader, c *prefixcache.Chains) uint64 {
	var k uint64
	found := false
	for i, name := range h.sessions {
		if v := hdr.PeekCanonical(name); len(v) > 0 {
			k = k*0x100000001B3 ^ (xxhash.Sum64(v) + uint64(i)*0x9E3779B97F4A7C15)
			found = true
		}
	}
	switch {
	case found:
		return k ^ sessionSeed | 1 // never 0, which is "none"
	case c.CacheKey != 0:
		return c.CacheKey ^ cacheKeySeed | 1
	}
	return 0
}
