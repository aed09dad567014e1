// Package workload builds the chat requests that the tests and benchmarks
// send: agent-loop conversations with a large shared context, and fresh
// requests of a parallel burst. Everything is seeded, so runs repeat.
package workload

import (
	"math/rand"
	"strconv"
	"strings"
)

// Message is one chat message, already in the proxy's wire form.
type Message struct {
	Role, Content string
}

// Text returns about n bytes of code-like text (about n/4 tokens) drawn from
// seed: lines of identifiers, quotes and newlines, so that JSON encoding
// needs escapes as it does for real source files.
func Text(seed int64, n int) string {
	rng := rand.New(rand.NewSource(seed))
	words := [...]string{"func", "return", "err", "if", "nil", "ctx", "for", "range", "replica", "prefix", "cache", "token", "\"ok\"", "{", "}", "\t", "x := y"}
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		b.WriteString(words[rng.Intn(len(words))])
		if rng.Intn(8) == 0 {
			b.WriteByte('\n')
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// Body returns a chat completion request for model with msgs.
func Body(model string, msgs []Message, stream bool, maxTokens int) []byte {
	size := 64
	for _, m := range msgs {
		size += len(m.Content) + 48
	}
	b := make([]byte, 0, size+size/8)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, model)
	b = append(b, `,"messages":[`...)
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":`...)
		b = strconv.AppendQuote(b, m.Role)
		b = append(b, `,"content":`...)
		b = appendJSONString(b, m.Content)
		b = append(b, '}')
	}
	b = append(b, `],"stream":`...)
	b = strconv.AppendBool(b, stream)
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	return append(b, '}')
}

func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// AgentContext returns the opening of an agent loop: a system prompt and a
// user turn that carries about contextBytes of file context.
func AgentContext(seed int64, contextBytes int) []Message {
	return []Message{
		{"system", "You are a coding agent. Session " + strconv.FormatInt(seed, 10) + ". " + Text(seed*7+1, 2000)},
		{"user", "Here are the files:\n" + Text(seed*7+2, contextBytes)},
	}
}

// Conversation returns a request of n messages (system, then alternating
// user and assistant) totalling about totalBytes: the shape of an agent loop
// late in its life. n=40 and totalBytes=360_000 is a 90k-token request.
func Conversation(seed int64, n, totalBytes int) []byte {
	per := totalBytes / n
	msgs := make([]Message, n)
	msgs[0] = Message{"system", Text(seed, per)}
	for i := 1; i < n; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		msgs[i] = Message{role, Text(seed+int64(i), per)}
	}
	return Body("model", msgs, false, 64)
}
