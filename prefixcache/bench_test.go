package prefixcache

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fastjson"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

// BenchmarkChains reads the chains of a 90k-token, 40-message agent-loop
// request, a link every DefaultPromptChunk bytes as the proxy reads them,
// and with links at message ends only, to show what the links inside
// messages cost.
func BenchmarkChains(b *testing.B) {
	body := workload.Conversation(1, 40, 360_000)
	b.Run("chunk=256", func(b *testing.B) { benchChunk(b, body, DefaultPromptChunk) })
	b.Run("messages", func(b *testing.B) { benchChunk(b, body, 0) })
}

func benchChains(b *testing.B, body []byte) { benchChunk(b, body, DefaultPromptChunk) }

func benchChunk(b *testing.B, body []byte, chunk int) {
	var c Chains
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		c.Read(body, chunk)
	}
	sinkLinks = c.Blocks
}

// BenchmarkChainsSmall reads the 2 KB, four-message body that
// scripts/peers.sh sends (loadgen -body 1800 -turns 1): most of its strings
// are short, so the cost per string counts more than the speed per byte.
func BenchmarkChainsSmall(b *testing.B) {
	benchChains(b, []byte(`{"model":"sim-30b","stream":false,"max_tokens":8,"messages":[{"role":"system","content":"worker 0 `+
		strings.Repeat("context ", 225)+`"},{"role":"user","content":"question 0"},{"role":"assistant","content":"answer 0"},{"role":"user","content":"next"}]}`))
}

// BenchmarkChainsPrompt reads a completions request whose prompt is 360 KB
// of the code-like text of BenchmarkChains.
func BenchmarkChainsPrompt(b *testing.B) {
	benchChains(b, codePrompt())
}

// codePrompt is a completions body whose prompt is 360 KB of code-like
// text, with an escape every 17 bytes or so.
func codePrompt() []byte {
	body, err := json.Marshal(map[string]any{"model": "m", "prompt": workload.Text(1, 360_000), "max_tokens": 64})
	if err != nil {
		panic(err)
	}
	return body
}

// BenchmarkChainsProse reads a 90k-token request of plain prose, with
// almost no escapes: the scanner's best case, where runs are found by
// vectorized byte search.
func BenchmarkChainsProse(b *testing.B) {
	msgs := make([]workload.Message, 40)
	for i := range msgs {
		msgs[i] = workload.Message{Role: "user", Content: strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200)}
	}
	benchChains(b, workload.Body("model", msgs, false, 64))
}

// BenchmarkJSONUnmarshalBaseline decodes the same body with encoding/json,
// the baseline that the scanner is measured against.
func BenchmarkJSONUnmarshalBaseline(b *testing.B) {
	body := workload.Conversation(1, 40, 360_000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var v struct {
			Model    string `json:"model"`
			Messages []struct {
				Role    string `json:"role"`
				Content any    `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPinMapParallel(b *testing.B) {
	m := NewPinMap(1<<16, 8)
	keys := make([]Link, 1<<14)
	rng := rand.New(rand.NewSource(1))
	for i := range keys {
		keys[i] = Link{Hash: rng.Uint64(), Check: uint64(i)}
		m.Put(keys[i], i&7)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919)) // each goroutine starts at its own place
		for pb.Next() {
			i++
			k := keys[i&(len(keys)-1)]
			if i&3 == 0 {
				m.Put(k, i&7)
			} else {
				m.Get(k)
			}
		}
	})
}

var (
	sinkLinks []Link
	next      atomic.Int64
)

// BenchmarkFastjsonBaseline parses the same body with valyala/fastjson and
// reads every message's content, unescaped: the fastest general JSON
// parser in Go as a baseline for the scanner (it builds a tree; the scanner
// hashes as it reads).
func BenchmarkFastjsonBaseline(b *testing.B) {
	body := workload.Conversation(1, 40, 360_000)
	var p fastjson.Parser
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		v, err := p.ParseBytes(body)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, m := range v.GetArray("messages") {
			n += len(m.GetStringBytes("content"))
		}
		if n == 0 {
			b.Fatal("no content")
		}
	}
}

// BenchmarkStr hashes every message's content of the bodies of
// BenchmarkChains (code) and BenchmarkChainsProse (prose) with
// str and with strPrevious, the decoding str that strCanon replaced, so that the
// two are compared in one run.
func BenchmarkStr(b *testing.B) {
	prose := make([]workload.Message, 40)
	for i := range prose {
		prose[i] = workload.Message{Role: "user", Content: strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200)}
	}
	bodies := []struct {
		name string
		body []byte
	}{
		{"code", workload.Conversation(1, 40, 360_000)},
		{"prose", workload.Body("model", prose, false, 64)},
	}
	for _, body := range bodies {
		// The opening quote of each content string, and their bytes.
		var at []int
		n := 0
		for i := 0; ; {
			j := bytes.Index(body.body[i:], []byte(`"content":"`))
			if j < 0 {
				break
			}
			i += j + len(`"content":`)
			s := scanner{b: body.body, i: i}
			s.str()
			at, n = append(at, i), n+s.i-i
		}
		for _, impl := range []struct {
			name string
			str  func(*scanner) (uint64, int)
		}{{"current", (*scanner).str}, {"previous", (*scanner).strPrevious}} {
			b.Run(body.name+"/"+impl.name, func(b *testing.B) {
				s := scanner{b: body.body}
				b.SetBytes(int64(n))
				b.ReportAllocs()
				var h uint64
				for b.Loop() {
					for _, i := range at {
						s.i = i
						v, _ := impl.str(&s)
						h += v
					}
				}
				if s.err != nil {
					b.Fatal(s.err)
				}
				sinkHash = h
			})
		}
	}
}

var sinkHash uint64

// BenchmarkStrEscapes hashes one 100 KB string of each kind of escape that
// a client may send: source code (\n \" \\ \t, the canonical spelling
// already), paths from an encoder that escapes '/' (PHP's json_encode), and
// Chinese text from one that escapes all but ASCII (Python's ensure_ascii).
func BenchmarkStrEscapes(b *testing.B) {
	for _, c := range []struct{ name, s string }{
		{"code", strings.Repeat(`\tif x == \"a\" {\n\t\treturn y\\n\n\t}\n`, 3000)},
		{"slashes", strings.Repeat(`src\/main\/java\/com\/x.java\n`, 4000)},
		{"uescapes", strings.Repeat(`\u4f60\u597d\uff0c\u4e16\u754c `, 4000)},
	} {
		body := []byte(`"` + c.s + `"` + tail)
		b.Run(c.name, func(b *testing.B) {
			s := scanner{b: body}
			b.SetBytes(int64(len(c.s)))
			b.ReportAllocs()
			var h uint64
			for b.Loop() {
				s.i = 0
				v, _ := s.str()
				h += v
			}
			if s.err != nil {
				b.Fatal(s.err)
			}
			sinkHash = h
		})
	}
}

// BenchmarkPinMapChurn is the pin map of a busy proxy at main's default
// capacity: full, each new request's link put (evicting the least recently
// used) and an earlier one's got, across a table far larger than the CPU's
// caches, where each entry touched is a cache miss.
func BenchmarkPinMapChurn(b *testing.B) {
	const capacity = 1 << 18
	m := NewPinMap(capacity, 8)
	rng := rand.New(rand.NewSource(1))
	keys := make([]Link, 1<<16)
	for i := 0; i < capacity; i++ {
		l := Link{Hash: rng.Uint64(), Check: uint64(i)}
		keys[i&(len(keys)-1)] = l
		m.Put(l, i&7)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l := Link{Hash: rng.Uint64(), Check: uint64(i)}
		m.Put(l, i&7)
		m.Get(keys[(i*7919)&(len(keys)-1)])
		keys[i&(len(keys)-1)] = l
	}
}

// BenchmarkHoldingsLongest asks 8 replicas, each holding 4M tokens' worth
// of other prompts and part of this one, how much of a 90k-token prompt
// they hold: the per-replica lookups of one routing decision.
func BenchmarkHoldingsLongest(b *testing.B) {
	var c Chains
	if err := c.Read(workload.Conversation(1, 40, 360_000), DefaultPromptChunk); err != nil {
		b.Fatal(err)
	}
	const replicas, kvBytes = 8, 4 << 20 * 4
	h := NewHoldings(replicas, 4<<20)
	var other Chains
	for r := range replicas {
		for i := 0; h.Held(r) < kvBytes-360_000; i++ {
			other.Read(workload.Conversation(int64(100*r+i+2), 40, 360_000), DefaultPromptChunk)
			h.Insert(r, other.Blocks, kvBytes)
		}
		h.Insert(r, c.Blocks[:len(c.Blocks)*r/replicas], kvBytes)
		if _, n := h.Longest(r, c.Blocks); n != len(c.Blocks)*r/replicas || h.Held(r) < kvBytes/2 {
			b.Fatalf("replica %d holds %d links of the prompt, %d bytes in all", r, n, h.Held(r))
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var sum int64
	for b.Loop() {
		for r := range replicas {
			n, _ := h.Longest(r, c.Blocks)
			sum += n
		}
	}
	sinkHash = uint64(sum)
}
