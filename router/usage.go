package router

import (
	"bytes"

	"github.com/warmroute/warmroute/upstream"
)

// What the replicas say of each prompt: how many tokens it had, and how
// many of them the replica's prefix cache already held. Counted by replica
// and routing reason, these make the routing's hit ratio one PromQL
// expression, and against the policy's prediction, the error of its
// estimate.
//
// The usage object is read from the bytes relayed anyway, without
// allocating: a body read whole has its last usageWindow bytes searched,
// as every server puts usage at the end. A stream keeps the last usageWindow bytes that
// it passed on in a ring (keepTail: a copy per read, no search), searched
// once when the stream ends whole: the final usage chunk, response.completed
// or message_delta is there, with data: [DONE] or message_stop after it.
// Finding the last event while the stream flows would cost a search of
// every read; a copy of its bytes is cheaper. A stream without usage has
// none, or "usage":null, in its window: nothing is counted.

// usageWindow is how far from an answer's end its usage is looked for: the
// usage object (about 200 bytes, 400 with Anthropic's cache fields) and
// whatever follows it in the body or the stream (the Responses object's
// last fields, data: [DONE]).
const usageWindow = 1024 // a power of two: the ring's index is a mask

const strUsageKey = `"usage"`

// maxTokens bounds a reported count, so that sums cannot overflow.
const maxTokens = 1 << 40

// scanUsage finds the last "usage" member of b, a JSON body or the tail of
// one, or the tail of an SSE stream, and returns the prompt's tokens and
// how many of them were cached:
//
//   - OpenAI chat and completions: prompt_tokens and
//     prompt_tokens_details.cached_tokens;
//   - the Responses API: input_tokens and input_tokens_details.cached_tokens;
//   - Anthropic Messages: input_tokens counts only the tokens after the last
//     cache mark, so the prompt is input_tokens + cache_read_input_tokens +
//     cache_creation_input_tokens, of which cache_read_input_tokens were
//     cached.
//
// ok is false when the last usage member is not an object holding
// prompt_tokens or input_tokens, or is cut off. Both counts are at least 0
// and cached is at most prompt. It never allocates.
func scanUsage(b []byte) (prompt, cached int64, ok bool) {
	// One pass forwards, keeping the value of the last member: searching
	// backwards from each key that is no member would be quadratic in a
	// tail full of them.
	v := -1
	for i := nextUsageKey(b, 0); i >= 0; i = nextUsageKey(b, i+1) {
		// A member's name follows { or , and is followed by a colon;
		// a string "usage" anywhere else (a value, an array element,
		// the end of an escaped quote) is not it.
		if p := skipSpaceBack(b, i); p < 0 || (b[p] != '{' && b[p] != ',') {
			continue
		}
		j := skipSpace(b, i+len(strUsageKey))
		if j >= len(b) || b[j] != ':' {
			continue
		}
		v = skipSpace(b, j+1)
	}
	if v < 0 || v >= len(b) || b[v] != '{' {
		return 0, 0, false // none, or "usage": null; the last usage says nothing
	}
	return readUsage(b[v:])
}

// nextUsageKey returns the index of the first "usage" in b at from or
// after, or -1. It searches for usage" and then looks at the byte before
// for the quote: bytes.Index led by the 'u' skips from one 'u' to the next
// with IndexByte, where a search led by the quote, which JSON has every few
// bytes, stops at each, and a backwards one (bytes.LastIndex, or a loop
// over bytes or words) looks at every byte. A stream that did not ask for
// usage, as most clients' do not, has its whole window searched:
// BenchmarkUsageStreamWithout under callgrind, 7240 instructions with a
// byte loop backwards, 5808 with a word at a time, 1796 so.
func nextUsageKey(b []byte, from int) int {
	for u := from + 1; u <= len(b); {
		i := bytes.Index(b[u:], strUsageTail)
		if i < 0 {
			return -1
		}
		i += u
		if b[i-1] == '"' {
			return i - 1
		}
		u = i + 1
	}
	return -1
}

// strUsageTail is strUsageKey without its opening quote.
var strUsageTail = []byte(strUsageKey[1:])

// readUsage reads the usage object at the start of b.
func readUsage(b []byte) (prompt, cached int64, ok bool) {
	promptTokens, inputTokens := int64(-1), int64(-1)
	var promptCached, inputCached, cacheRead, cacheCreation int64
	for i := 1; ; {
		name, next, end := member(b, i)
		if next < 0 {
			return 0, 0, false
		}
		if end {
			cacheRead, cacheCreation = max(cacheRead, 0), max(cacheCreation, 0)
			switch {
			case promptTokens >= 0:
				prompt, cached = promptTokens, promptCached
			case inputTokens >= 0:
				prompt = min(inputTokens+cacheRead+cacheCreation, maxTokens)
				cached = inputCached + cacheRead
			default:
				return 0, 0, false
			}
			return prompt, min(cached, prompt), true
		}
		switch string(name) {
		case "prompt_tokens":
			promptTokens, i = readCount(b, next)
		case "input_tokens":
			inputTokens, i = readCount(b, next)
		case "cache_read_input_tokens":
			cacheRead, i = readCount(b, next)
		case "cache_creation_input_tokens":
			cacheCreation, i = readCount(b, next)
		case "prompt_tokens_details":
			promptCached, i = readDetails(b, next)
		case "input_tokens_details":
			inputCached, i = readDetails(b, next)
		default:
			i = skipValue(b, next)
		}
		if i < 0 {
			return 0, 0, false
		}
	}
}

// readDetails reads the cached_tokens of the details object at b[i] (0
// when it is null or has none) and returns the index after it, or -1.
func readDetails(b []byte, i int) (int64, int) {
	if i >= len(b) || b[i] != '{' {
		return 0, skipValue(b, i)
	}
	var c int64
	for i++; ; {
		name, next, end := member(b, i)
		if next < 0 {
			return 0, -1
		}
		if end {
			return max(c, 0), next
		}
		if string(name) == "cached_tokens" {
			c, i = readCount(b, next)
		} else {
			i = skipValue(b, next)
		}
		if i < 0 {
			return 0, -1
		}
	}
}

// member reads an object's next member at b[i], after its '{' or a value:
// its name and the index of its value; or, where the object closes, end
// and the index after the '}'. next is -1 for a malformed or cut object.
func member(b []byte, i int) (name []byte, next int, end bool) {
	for {
		i = skipSpace(b, i)
		if i >= len(b) {
			return nil, -1, false
		}
		switch b[i] {
		case '}':
			return nil, i + 1, true
		case ',':
			i++
			continue
		case '"':
		default:
			return nil, -1, false
		}
		if name, i = readName(b, i); i < 0 {
			return nil, -1, false
		}
		if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
			return nil, -1, false
		}
		return name, skipSpace(b, i+1), false
	}
}

// readName returns the raw bytes of the string at b[i] (a '"') and the
// index after its closing quote, or -1 if it is not closed.
func readName(b []byte, i int) ([]byte, int) {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return nil, -1
		}
		k += j
		// Escaped when an odd number of backslashes is before it.
		p := k - 1
		for p > i && b[p] == '\\' {
			p--
		}
		if (k-1-p)%2 == 0 {
			return b[i+1 : k], k + 1
		}
		j = k + 1
	}
}

// readCount reads the token count at b[i]: a non-negative integer, at most
// maxTokens, or -1 for anything else (null, a negative or a string), and
// returns the index after the value, or -1 if it is malformed.
func readCount(b []byte, i int) (int64, int) {
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		return -1, skipValue(b, i)
	}
	var v int64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if v < maxTokens {
			v = v*10 + int64(b[i]-'0')
		}
	}
	// A fraction or an exponent (12.0, 1e3) is not a count a server
	// writes; its integer part is kept and the rest skipped.
	for i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i] == '+' || b[i] == '-' || b[i] >= '0' && b[i] <= '9') {
		i++
	}
	return min(v, maxTokens), i
}

// skipValue returns the index of the ',', '}' or ']' that ends the JSON
// value at b[i], or -1 if it is cut off. Objects and arrays nest without
// recursion; a malformed value ends where such a byte is found outside
// strings at its own depth, and the caller then finds what follows wrong.
func skipValue(b []byte, i int) int {
	depth := 0
	for i >= 0 && i < len(b) {
		switch b[i] {
		case '"':
			_, i = readName(b, i)
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
		case ',':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return -1
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipSpaceBack returns the index of the last byte before i that is not
// white space, or -1.
func skipSpaceBack(b []byte, i int) int {
	i--
	for i >= 0 && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i--
	}
	return i
}

// keepTail keeps the last usageWindow bytes that the stream relayed, in a
// ring: p's last bytes overwrite the oldest.
func (x *exchange) keepTail(p []byte) {
	t, s := x.tail[:usageWindow], &x.stream
	if len(p) > usageWindow {
		s.tailed += int64(len(p) - usageWindow)
		p = p[len(p)-usageWindow:]
	}
	i := int(s.tailed & (usageWindow - 1))
	n := copy(t[i:], p)
	copy(t, p[n:])
	s.tailed += int64(len(p))
}

// streamTail returns the stream's kept bytes in order, rotating the ring
// through a copy on the stack: three copies of a kilobyte cost a tenth of
// the three in-place reversals they replaced.
func (x *exchange) streamTail() []byte {
	t, tailed := x.tail, x.stream.tailed
	if tailed <= int64(len(t)) {
		return t[:tailed]
	}
	i := int(tailed % int64(len(t)))
	var tmp [usageWindow]byte
	n := copy(tmp[:], t[i:])
	copy(tmp[n:], t[:i])
	copy(t, tmp[:])
	x.stream.tailed = int64(len(t)) // now in order from the start
	return t
}

// countAnswer counts what the replica reported of the prompt of an answer
// that ended with res, a 2xx answer read whole or a stream that ended
// whole (its tail), and learns from it what the replica holds (learn); a
// cut stream counts nothing.
func (x *exchange) countAnswer(res upstream.Result, streamed bool) {
	if res != upstream.OK || x.status < 200 || x.status >= 300 {
		return
	}
	var body []byte
	switch {
	case streamed:
		body = x.streamTail() // never Response.Body(): it would read the stream
	default:
		body = x.ctx.Response.Body()
	}
	if len(body) > usageWindow {
		body = body[len(body)-usageWindow:]
	}
	prompt, cached, ok := scanUsage(body)
	x.learn(prompt, cached, ok)
	if ok {
		x.promptTokens, x.cachedTokens = prompt, cached
		x.h.m.promptTokens(x.r.Index, x.reason, prompt, cached, int64(x.predictedCached))
	}
}
