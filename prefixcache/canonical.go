package prefixcache

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/bits"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Link is one prefix of a request's rendering (render.go): Hash covers the
// rendering up to it, seeded by the model, the tools and the cache salt;
// Check is an independent summary of the same prefix (the link's place in
// its chain and the text bytes up to it), stored beside Hash so that two
// prefixes whose 64-bit hashes collide are told apart and counted.
type Link struct {
	Hash  uint64
	Check uint64
}

// Errors of Chains.Read. They are preallocated: a malformed body is counted
// on the hot path, never formatted.
var (
	ErrMalformed = errors.New("prefixcache: malformed JSON")
	ErrTooDeep   = errors.New("prefixcache: JSON nested deeper than 64 levels")
	ErrNotChat   = errors.New("prefixcache: not a chat request (no messages array)")
)

// maxDepth bounds recursion so that a body of nested brackets cannot exhaust
// the stack; real chat requests nest fewer than ten levels.
const maxDepth = 64

// Seeds and tags keep values of different JSON types apart: the string "1"
// and the number 1 must not hash alike.
const (
	seedString = 0x9E3779B97F4A7C15
	tagNumber  = 0xC2B2AE3D27D4EB4F
	tagTrue    = 0x165667B19E3779F9
	tagFalse   = 0x27D4EB2F165667C5
	tagNull    = 0x85EBCA77C2B2AE63
	tagArray   = 0xFF51AFD7ED558CCD
	tagObject  = 0xC4CEB9FE1A85EC53
	seedChain  = 0x2545F4914F6CDD1D
)

var (
	keyMessages = hashString("messages")
	keyModel    = hashString("model")
	keyTools    = hashString("tools")
	// keySalt is vLLM's cache_salt: requests with different salts never
	// share KV blocks, so they must not share pins.
	keySalt   = hashString("cache_salt")
	keyPrompt = hashString("prompt")
	// keySystem is the Anthropic Messages API's system prompt, which sits
	// beside the messages and shapes the prompt as much as they do.
	keySystem = hashString("system")
	// keyCacheControl marks where a client asks for prompt caching
	// (Anthropic's cache_control); it does not change the prompt, so it
	// does not change the key.
	keyCacheControl = hashString("cache_control")
	// keyInput and keyInstructions are the Responses API's conversation
	// and system prompt: input items chain like messages.
	keyInput        = hashString("input")
	keyInstructions = hashString("instructions")
	// keyCacheKey is OpenAI's prompt_cache_key (chat completions and
	// Responses): a client's name for the requests that should share a
	// cache, which coding agents set to their session's id. It routes,
	// but does not change the prompt or the engine's cache, so it is not
	// in the chain's seed.
	keyCacheKey = hashString("prompt_cache_key")
)

// DefaultPromptChunk is the default of -prompt-chunk: the bytes of a
// request's rendering between two links of its Blocks chain. vLLM and
// SGLang cache a prompt in blocks of 16 tokens (vLLM) or 1 (SGLang), about
// 64 bytes of text for vLLM's; 256 bytes is four such blocks, so a prompt
// that shares an earlier one's first N tokens is known to share all but at
// most 64 of them, and a 90k-token prompt makes about 1,400 links.
const DefaultPromptChunk = 256

// promptTokensChunk is the chunk of a prompt given as token ids: 256
// tokens, 16 of vLLM's blocks.
const promptTokensChunk = 256

// Chains is what a request body is keyed by: its model and two prefix
// chains of its canonical rendering (render.go). Messages has one link per
// message (for a completions prompt, one per chunk of it): conversations
// are pinned by it. Blocks has one link per chunk bytes of the rendering
// and one at each message end: what a replica's cache holds is known by
// it (Holdings). Its storage is kept across Read calls.
type Chains struct {
	Messages []Link
	Blocks   []Link
	// Model is the key of the body's top-level "model" string (see
	// ModelKey), 0 when it has none; it is read whatever the request.
	Model uint64
	// CacheKey is the key of the body's top-level "prompt_cache_key"
	// string, as ModelKey keys a name (escapes decode first), 0 when it
	// has none or an empty one. It is read, and kept, as Model is.
	CacheKey uint64
}

// Read sets c to the chains of body, links every chunk bytes of its
// rendering (none inside messages when chunk is 0, and then no chain for
// a completions prompt). A chat, Messages or Responses request is
// rendered message by message; a completions request's string prompt as
// its text, and a prompt of token ids one link per 256 ids, in both
// chains. A batch of prompts makes no chain. A body with neither messages
// nor a prompt gives ErrNotChat, one it cannot read ErrMalformed or
// ErrTooDeep; the chains are empty with any error, and Model is set but
// for a body it cannot read. It allocates nothing once c's chains have
// room for the links.
func (c *Chains) Read(body []byte, chunk int) error {
	s := scanner{b: body}
	s.r.blocks, s.r.msgs = c.Blocks[:0], c.Messages[:0]
	err := s.chains(chunk)
	c.Blocks, c.Messages, c.Model, c.CacheKey = s.r.blocks, s.r.msgs, s.model, s.cacheKey
	if err != nil {
		c.Blocks, c.Messages = c.Blocks[:0], c.Messages[:0]
	}
	if err != nil && err != ErrNotChat {
		c.Model, c.CacheKey = 0, 0
	}
	return err
}

// prompt kinds: what the rendering of a body renders after its system
// prompt.
const (
	promptNone = iota
	promptMessages
	promptInput // a Responses input given as one string
	promptText  // a completions prompt given as one string
)

func (s *scanner) chains(chunk int) error {
	var seed uint64 = seedChain
	// Where the rendered values start in the body, -1 for none: a
	// system prompt that comes after the messages in the body is
	// rendered before them, and a repeated key is rendered anew.
	sys, prompt, kind := -1, -1, promptNone
	hasMessages := false
	s.r.reset(chunk)
	s.ws()
	if !s.expect('{') {
		return ErrMalformed
	}
	s.ws()
	if s.peek() == '}' {
		return ErrNotChat
	}
	for {
		s.ws()
		k, ok := s.key()
		if !ok {
			return ErrMalformed
		}
		c := s.peek()
		switch {
		case k == keyMessages && c == '[',
			k == keyInput && !hasMessages && (c == '[' || c == '"'),
			k == keyPrompt && chunk > 0 && !hasMessages && (c == '"' || c == '['):
			// The last of them wins, as in most decoders; a
			// prompt or input after messages is not read.
			hasMessages = hasMessages || k == keyMessages
			next := promptMessages
			switch {
			case k == keyPrompt:
				next = promptText
			case c == '"':
				next = promptInput
			}
			at, ok := s.i, false
			if kind != promptNone {
				// Rendered anew, after the system prompt.
				_, ok = s.rerender(sys, s.i, next, chunk)
			} else {
				ok = s.renderPrompt(next)
			}
			prompt, kind = at, next
			if !ok {
				prompt, kind = -1, promptNone // a batch of prompts
			}
		case (k == keySystem || k == keyInstructions) && c != 'n':
			// A null system prompt is none.
			if sys >= 0 || kind != promptNone {
				// A repeated system prompt, or one after the
				// prompt in the body: all is rendered anew, this
				// first.
				sys = s.i
				end, _ := s.rerender(sys, prompt, kind, chunk)
				s.i = end
			} else {
				sys = s.i
				s.renderAs(roleSystem, len("system"), false)
			}
		case k == keyModel || k == keyTools || k == keySalt:
			isString := c == '"'
			v := s.value(1)
			seed = mix(seed, mix(k, v))
			if k == keyModel && isString {
				s.model = v
			}
		case k == keyCacheKey:
			// The last one wins, as in most decoders: one that is
			// not a string, or an empty one, is none.
			s.cacheKey = 0
			if c != '"' {
				s.value(1)
				break
			}
			h, n := s.str()
			s.text += uint64(n)
			if n > 0 {
				s.cacheKey = h
			}
		default:
			s.value(1)
		}
		if s.err != nil {
			return s.err
		}
		s.ws()
		if s.peek() == ',' {
			s.i++
			continue
		}
		if !s.expect('}') {
			return ErrMalformed
		}
		break
	}
	s.ws()
	if s.i != len(s.b) {
		return ErrMalformed
	}
	if kind == promptNone {
		return ErrNotChat
	}
	s.r.finish(seed)
	return nil
}

// rerender renders the system prompt at sys and the prompt of the given
// kind at prompt anew (either -1 for none) and returns where the system
// prompt ends, and false for a prompt that makes no chain (a batch).
func (s *scanner) rerender(sys, prompt, kind, chunk int) (int, bool) {
	s.r.reset(chunk)
	end := -1
	if sys >= 0 {
		s.i = sys
		s.renderAs(roleSystem, len("system"), false)
		end = s.i
	}
	ok := true
	if prompt >= 0 {
		s.i = prompt
		ok = s.renderPrompt(kind)
	}
	return end, ok
}

// renderPrompt renders the prompt of the given kind at s.i, and reports
// false, having skipped it, for a prompt that makes no chain: a batch of
// completions prompts.
func (s *scanner) renderPrompt(kind int) bool {
	switch kind {
	case promptMessages:
		s.renderMessages()
	case promptInput:
		s.renderAs(roleUser, len("user"), true)
	default:
		if s.peek() == '[' {
			return s.promptTokens()
		}
		s.r.promptC = true
		s.renderString()
		s.r.promptC = false
		s.r.link(false)
	}
	return true
}

// promptTokens renders a completions prompt of token ids, a link in both
// chains every promptTokensChunk ids, each link's Bytes the ids so far; it
// reports false, having skipped the value and rendered nothing, for
// anything else.
func (s *scanner) promptTokens() bool {
	st, chunk := s.save(), s.r.chunk
	s.r.chunk = 0 // links by count, not by bytes
	ok := s.tokens()
	s.r.chunk = chunk
	if !ok {
		s.rewind(&st)
		s.value(1)
	}
	return ok
}

func (s *scanner) tokens() bool {
	s.i++ // '['
	for n := 0; ; {
		s.ws()
		c := s.peek()
		if c == ']' && n == 0 {
			s.i++
			return true
		}
		if c != '-' && (c < '0' || c > '9') {
			// Not token ids: a batch of prompts, or something else.
			return false
		}
		s.r.tag(s.number())
		s.r.text++
		if n++; n%promptTokensChunk == 0 {
			s.r.link(true)
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			s.fail(ErrMalformed)
			return true
		}
	}
}

// ModelKey is the key that Chains.Read gives a body whose "model" is
// name, however the body spells it (escapes decode first).
func ModelKey(name string) uint64 {
	b, _ := json.Marshal(name)
	s := scanner{b: b}
	h, _ := s.str()
	return h
}

// scanner is a single-pass JSON reader that hashes values as it reads them.
// It never allocates: strings are hashed straight from the body.
type scanner struct {
	b     []byte
	i     int
	err   error
	text  uint64 // decoded bytes of string values hashed
	model uint64 // the key of the body's model (Chains.Model)
	// cacheKey is the key of the body's prompt_cache_key (Chains.CacheKey).
	cacheKey uint64
	// buf gathers canonical string bytes for the digest; it lives here
	// so that it is zeroed once a request, not once a string.
	buf [strBuf]byte
	// streaming sends the bytes that strCanon spells to the rendering r,
	// not to the string's own digest (renderString).
	streaming bool
	// sorted is set once an object was read out of order: every object
	// after it is read by renderSorted (render.go).
	sorted bool
	r      renderer
}

// write gives canonical string bytes to strCanon's digest d, or to the
// rendering: one well-predicted branch a run.
func (s *scanner) write(d *xxhash.Digest, p []byte) {
	if s.streaming {
		s.r.feed(p, true)
		return
	}
	d.Write(p)
}

// strBuf is the size of the scanner's buffer of decoded bytes: the digest
// is written most of a kilobyte at a time, and decodeDense returns to str
// to empty the buffer once every dozen blocks or so (512 bytes made that
// every five blocks, and the code-like body 5% slower).
const strBuf = 1024

// key reads an object member's key, its colon and the space around it:
// s.i is then at the member's value. It reports false, having failed s,
// for anything else.
func (s *scanner) key() (uint64, bool) {
	if s.peek() != '"' {
		s.fail(ErrMalformed)
		return 0, false
	}
	k, _ := s.str()
	s.ws()
	if !s.expect(':') {
		return 0, false
	}
	s.ws()
	return k, true
}

func (s *scanner) fail(err error) {
	if s.err == nil {
		s.err = err
	}
	s.i = len(s.b)
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) expect(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	s.fail(ErrMalformed)
	return false
}

func (s *scanner) ws() {
	// Compact JSON has no whitespace: one comparison finds none.
	for s.i < len(s.b) && s.b[s.i] <= ' ' {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value hashes the JSON value at s.i and advances past it.
func (s *scanner) value(depth int) uint64 {
	if depth > maxDepth {
		s.fail(ErrTooDeep)
		return 0
	}
	switch c := s.peek(); c {
	case '"':
		h, n := s.str()
		s.text += uint64(n)
		return h
	case '{':
		return s.object(depth)
	case '[':
		return s.array(depth)
	case 't':
		return s.literal("true", tagTrue)
	case 'f':
		return s.literal("false", tagFalse)
	case 'n':
		return s.literal("null", tagNull)
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return s.number()
		}
		s.fail(ErrMalformed)
		return 0
	}
}

func (s *scanner) literal(lit string, tag uint64) uint64 {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		s.fail(ErrMalformed)
		return 0
	}
	s.i += len(lit)
	return tag
}

// number hashes a number by its literal spelling: 1 and 1.0 differ. Chat
// messages carry numbers only inside tool arguments, which clients echo back
// byte for byte, so normalizing them would cost time and win nothing.
func (s *scanner) number() uint64 {
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			s.i++
			continue
		}
		break
	}
	return xxhash.Sum64(s.b[start:s.i]) ^ tagNumber
}

func (s *scanner) array(depth int) uint64 {
	s.i++ // '['
	h := uint64(tagArray)
	var n uint64
	s.ws()
	if s.peek() == ']' {
		s.i++
		return mix(h, n)
	}
	for {
		s.ws()
		h = mix(h, s.value(depth+1))
		n++
		if s.err != nil {
			return 0
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return mix(h, n)
		default:
			s.fail(ErrMalformed)
			return 0
		}
	}
}

// object hashes an object independently of key order: each key-value pair is
// hashed on its own and the pair hashes are summed. Pairs whose value is null
// are left out, since `"name": null` and no name mean the same message.
func (s *scanner) object(depth int) uint64 {
	s.i++ // '{'
	var sum, n uint64
	s.ws()
	if s.peek() == '}' {
		s.i++
		return mix(tagObject, 0)
	}
	for {
		s.ws()
		k, ok := s.key()
		if !ok {
			return 0
		}
		isNull := s.peek() == 'n'
		text := s.text
		v := s.value(depth + 1)
		if s.err != nil {
			return 0
		}
		if k == keyCacheControl {
			s.text = text // as if it were not there
		} else if !isNull {
			sum += pair(k, v)
			n++
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return mix(tagObject, sum^n)
		default:
			s.fail(ErrMalformed)
			return 0
		}
	}
}

// str hashes the string at s.i and reports its decoded length. What it
// hashes is the string's canonical spelling (strCanon).
func (s *scanner) str() (uint64, int) {
	b := s.b
	i := s.i + 1 // past '"'
	// A short string without escapes (a key, a role, a model name: most
	// strings of a small request) is found by bit arithmetic on its first
	// 32 bytes and hashed in one pass, without a digest, a search call or
	// a copy.
	if i <= len(b)-32 {
		for k := i; k < i+32; k += 8 {
			if m := special(binary.LittleEndian.Uint64(b[k:])); m != 0 {
				if j := k + bits.TrailingZeros64(m)>>3; b[j] == '"' {
					s.i = j + 1
					return sum64Short(b[i:j]), j - i
				}
				break
			}
		}
	} else {
		// The body's last 32 bytes, where its last strings are (a
		// chat's last message, a role): a byte at a time.
		for j := i; j < len(b) && b[j] != '\\'; j++ {
			if b[j] == '"' {
				s.i = j + 1
				return sum64Short(b[i:j]), j - i
			}
		}
	}
	return s.strCanon()
}

// strCanon is str for a string that goes to one digest: it hashes the
// string's canonical spelling, not its decoded bytes. The canonical
// spelling writes '"' and '\\' and the five control bytes that have a
// one-letter escape (\n \t \r \b \f) as those escapes, and every other
// byte as itself. A decoded string has one canonical spelling, and a
// spelling one decoded string, so two spellings of a string hash alike and
// two strings apart, as with decoded bytes (FuzzCanonical).
//
// The point is that a body's spelling is canonical already, but for its \/
// and \u escapes: source code and tool output in a prompt escape newlines,
// quotes, backslashes and tabs, an escape every dozen bytes, and all of
// those stay as they are. So the body's bytes go to the digest straight
// from the body, the whole string in one write when it has no \/ or \u,
// with nothing copied or decoded; only the escapes are counted, for the
// decoded length. Raw control bytes, which JSON does not allow in a string,
// are hashed as they are.
func (s *scanner) strCanon() (uint64, int) {
	b := s.b
	start := s.i + 1 // past '"'
	var d xxhash.Digest
	d.ResetWithSeed(seedString)
	i := start    // where the search goes on
	from := start // the body's bytes from here on are in neither d nor s.buf
	shrink := 0   // body bytes minus decoded bytes, so far
	nb := 0       // bytes in s.buf, not yet in d
	q := -1       // the next quote at or after i, in sparse mode
	dense := false
	for {
		// j: the next quote, or backslash of an escape to spell anew.
		j := -1
		if dense {
			// A block of 64 bytes at a time: bit arithmetic finds its
			// quotes and backslashes, and the canonical escapes among
			// them are only counted. An escape spelled anew is done in
			// place, and the search goes on in the same block.
		blocks:
			for i <= len(b)-65 { // a block, and the byte that a backslash at its end escapes
				m := specials64((*[64]byte)(b[i : i+64]))
				next := i + 64
				for m != 0 {
					p := trailingZeros(m) & 63
					k := i + p
					if b[k] == '"' {
						j = k
						break blocks
					}
					if canonicalEscape[b[k+1]] {
						shrink++
						m &^= 3 << uint(p) // the backslash and the byte it escapes
						next = max(next, k+2)
						continue
					}
					var ok bool
					if nb, from, shrink, ok = s.respell(&d, nb, from, k, shrink); !ok {
						return 0, 0
					}
					if e := s.i - i; e < 64 {
						m &^= 1<<uint(e) - 1
					} else {
						m = 0
					}
					next = max(next, s.i)
				}
				i = next
			}
		}
		if j < 0 {
			// Sparse mode, and the last bytes of the body.
			if q < i {
				q = bytes.IndexByte(b[i:], '"')
				if q < 0 {
					s.fail(ErrMalformed)
					return 0, 0
				}
				q += i
			}
			j = q
			if bs := bytes.IndexByte(b[i:q], '\\'); bs >= 0 {
				j = i + bs
			}
			dense = j-i < denseRun
		}
		if b[j] == '"' {
			if nb > 0 {
				s.write(&d, s.buf[:nb])
			}
			s.write(&d, b[from:j])
			s.i = j + 1
			return d.Sum64(), j - start - shrink
		}
		// b[j] is a backslash.
		if j+1 < len(b) && canonicalEscape[b[j+1]] {
			shrink++
			i = j + 2
			continue
		}
		var ok bool
		if nb, from, shrink, ok = s.respell(&d, nb, from, j, shrink); !ok {
			return 0, 0
		}
		i = s.i
	}
}

// respell is strCanon at an escape that is not the canonical spelling, at
// j (a backslash; from is where the body's bytes not yet given start): it
// gives the body's bytes before it and its canonical spelling to d (put),
// sets s.i past it, and returns the new nb, from and shrink, or false for
// a malformed escape. \/ is the '/' after the backslash, the start of the
// next run; \u is decoded.
func (s *scanner) respell(d *xxhash.Digest, nb, from, j, shrink int) (int, int, int, bool) {
	nb = s.put(d, nb, s.b[from:j])
	if j+1 < len(s.b) && s.b[j+1] == '/' {
		s.i = j + 2
		return nb, j + 1, shrink + 1, true
	}
	s.i = j
	var t [4]byte
	k := s.escape(&t)
	if s.err != nil {
		return 0, 0, 0, false
	}
	shrink += s.i - j - k
	if c := canonicalLetter[t[0]]; k == 1 && c != 0 {
		t[0], t[1], k = '\\', c, 2
	}
	return s.put(d, nb, t[:k]), s.i, shrink, true
}

// put gives p, body bytes or a canonical spelling, to d after the nb bytes
// in s.buf and returns the bytes in s.buf: short pieces gather there, so
// that a string of many \u escapes (text from an encoder that escapes all
// but ASCII) makes few digest writes, and long runs go to d as they are.
func (s *scanner) put(d *xxhash.Digest, nb int, p []byte) int {
	if len(p) >= 256 || nb+len(p) > len(s.buf) {
		s.write(d, s.buf[:nb])
		nb = 0
		if len(p) >= 256 {
			s.write(d, p)
			return 0
		}
	}
	return nb + copy(s.buf[nb:], p)
}

// canonicalEscape marks the bytes that, after a backslash, make an escape
// that is the canonical spelling of what it stands for (strCanon).
var canonicalEscape = [256]bool{'"': true, '\\': true, 'n': true, 't': true, 'r': true, 'b': true, 'f': true}

// canonicalLetter is the letter of the escape that spells a decoded byte
// in the canonical spelling, 0 for a byte spelled as itself.
var canonicalLetter = [256]byte{'"': '"', '\\': '\\', '\n': 'n', '\t': 't', '\r': 'r', '\b': 'b', '\f': 'f'}

// sum64Short is what an xxhash.Digest reset with seedString returns for
// p, shorter than 32 bytes, as its Sum64 computes it: one pass, no state.
func sum64Short(p []byte) uint64 {
	const (
		prime1 uint64 = 11400714785074694791
		prime2 uint64 = 14029467366897019727
		prime3 uint64 = 1609587929392839161
		prime4 uint64 = 9650029242287828579
		prime5 uint64 = 2870177450012600261
	)
	h := seedString + prime5 + uint64(len(p))
	for ; len(p) >= 8; p = p[8:] {
		k := bits.RotateLeft64(binary.LittleEndian.Uint64(p)*prime2, 31) * prime1
		h ^= k
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(p) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(p)) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		p = p[4:]
	}
	for _, c := range p {
		h ^= uint64(c) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// denseRun is the run length below which strCanon reads blocks rather than
// search: a run this short costs more to find with a call than to copy.
const denseRun = 64

// specials64 returns a mask with bit j set where byte j of p is '"' or
// '\\', exactly (unlike special's, every bit is right).
func specials64(p *[64]byte) uint64 {
	return specials8(binary.LittleEndian.Uint64(p[0:])) |
		specials8(binary.LittleEndian.Uint64(p[8:]))<<8 |
		specials8(binary.LittleEndian.Uint64(p[16:]))<<16 |
		specials8(binary.LittleEndian.Uint64(p[24:]))<<24 |
		specials8(binary.LittleEndian.Uint64(p[32:]))<<32 |
		specials8(binary.LittleEndian.Uint64(p[40:]))<<40 |
		specials8(binary.LittleEndian.Uint64(p[48:]))<<48 |
		specials8(binary.LittleEndian.Uint64(p[56:]))<<56
}

// specials8 is specials64 for the eight bytes of w: a byte with bit j set
// where byte j of w is '"' or '\\'.
func specials8(w uint64) uint64 {
	const ones, lows, highs = 0x0101010101010101, 0x7F7F7F7F7F7F7F7F, 0x8080808080808080
	// Each byte is compared by its low seven bits v: (v ^ c) + 0x7F has
	// its high bit set unless v == c, and carries into no other byte. A
	// byte with its own high bit set (UTF-8) is no quote or backslash
	// whatever its low bits, so w's high bits clear it. Nine operations a
	// word; comparing whole bytes took thirteen.
	v := w & lows
	x := (v ^ '"'*ones) + lows
	y := (v ^ '\\'*ones) + lows
	m := highs &^ (x&y | w)
	// Gather the eight high bits into one byte.
	return (m >> 7) * 0x0102040810204080 >> 56
}

// trailingZeros is bits.TrailingZeros64 for a nonzero m, as a count of
// the bits below the lowest set one: bits.TrailingZeros64 is BSF and CMOV
// on amd64 below GOAMD64=v3, and decodeDense was 7% slower with it on the
// code-like body (AMD EPYC).
func trailingZeros(m uint64) int {
	return bits.OnesCount64(^m & (m - 1))
}

// special returns the high bit of each byte of w that is '"' or '\\': the
// lowest set bit marks the first such byte (bits above it may be false).
func special(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	x := w ^ ('"' * ones)
	y := w ^ ('\\' * ones)
	return ((x-ones)&^x | (y-ones)&^y) & highs
}

// escape decodes the escape sequence at s.i (a backslash) into buf and
// returns its length. Unpaired surrogates decode to U+FFFD, as in Go's
// encoding/json, so every spelling of one string hashes alike.
func (s *scanner) escape(buf *[4]byte) int {
	if s.i+1 >= len(s.b) {
		s.fail(ErrMalformed)
		return 0
	}
	c := s.b[s.i+1]
	s.i += 2
	switch c {
	case '"', '\\', '/':
		buf[0] = c
	case 'b':
		buf[0] = '\b'
	case 'f':
		buf[0] = '\f'
	case 'n':
		buf[0] = '\n'
	case 'r':
		buf[0] = '\r'
	case 't':
		buf[0] = '\t'
	case 'u':
		r := s.hex4()
		if s.err != nil {
			return 0
		}
		if r >= 0xD800 && r < 0xDC00 {
			// A high surrogate: a low one must follow to make one rune.
			if s.i+6 <= len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
				save := s.i
				s.i += 2
				lo := s.hex4()
				if s.err != nil {
					return 0
				}
				if lo >= 0xDC00 && lo < 0xE000 {
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				} else {
					s.i = save
					r = utf8.RuneError
				}
			} else {
				r = utf8.RuneError
			}
		} else if r >= 0xDC00 && r < 0xE000 {
			r = utf8.RuneError
		}
		return utf8.EncodeRune(buf[:], r)
	default:
		s.fail(ErrMalformed)
		return 0
	}
	return 1
}

func (s *scanner) hex4() rune {
	if s.i+4 > len(s.b) {
		s.fail(ErrMalformed)
		return 0
	}
	var r rune
	for _, c := range s.b[s.i : s.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			s.fail(ErrMalformed)
			return 0
		}
	}
	s.i += 4
	return r
}

func hashString(v string) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seedString)
	d.WriteString(v)
	return d.Sum64()
}

// mix folds v into h; the order of arguments matters.
func mix(h, v uint64) uint64 {
	h ^= bits.RotateLeft64(v*0xC2B2AE3D27D4EB4F, 31) * 0x9E3779B97F4A7C15
	h = bits.RotateLeft64(h, 27)*0x9E3779B97F4A7C15 + 0x85EBCA77C2B2AE63
	return fmix(h)
}

// pair hashes one key-value pair so that swapping key and value changes it.
func pair(k, v uint64) uint64 {
	return fmix(k*0x9E3779B97F4A7C15 ^ bits.RotateLeft64(v, 23)*0xC2B2AE3D27D4EB4F)
}

func fmix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xFF51AFD7ED558CCD
	h ^= h >> 33
	h *= 0xC4CEB9FE1A85EC53
	h ^= h >> 33
	return h
}
