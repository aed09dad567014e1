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

// Link is one message boundary of a chat request: Hash covers messages 0..i
// and seeds the pin map; Check is an independent summary of the same prefix
// (message count and decoded text length), stored beside Hash so that two
// prefixes whose 64-bit hashes collide are told apart and counted.
type Link struct {
	Hash  uint64
	Check uint64
}

// Errors of AppendRequestChain. They are preallocated: a malformed body is counted
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
)

// DefaultPromptChunk is the default prompt chunk, in decoded bytes (the
// default of -prompt-chunk). vLLM caches a prompt in blocks
// of 16 tokens, about 64 bytes of text; 1 KiB is about 16 such blocks, so a
// prompt that matches an earlier one up to a chunk boundary matches whole
// blocks of its cache, and a 90k-token prompt makes about 350 links.
const DefaultPromptChunk = 1024

// promptTokensChunk is the chunk of a prompt given as token ids: 256
// tokens, 16 of vLLM's blocks.
const promptTokensChunk = 256

// AppendRequestChain appends the prefix chain of a request body to dst and
// returns the extended slice and the key of the body's top-level "model"
// string (see ModelKey), or 0 when it has none; the key is read whatever
// the request. A chat request makes one Link per message; a completions
// request's "prompt" one per promptChunk decoded bytes (or per 256 token
// ids), so that a prompt that extends an earlier one shares its links. A
// batch of prompts makes no chain, and neither does any prompt when
// promptChunk is 0. A body with neither messages nor a prompt gives
// ErrNotChat, one it cannot read ErrMalformed or ErrTooDeep; dst is
// returned unextended with any error. It allocates nothing once dst has
// room for the links.
func AppendRequestChain(dst []Link, body []byte, promptChunk int) ([]Link, uint64, error) {
	start := len(dst)
	hasPrompt := false
	s := scanner{b: body}
	var seed uint64 = seedChain
	var model uint64
	hasMessages := false
	s.ws()
	if !s.expect('{') {
		return dst[:start], 0, ErrMalformed
	}
	s.ws()
	if s.peek() == '}' {
		s.i++
		return dst[:start], 0, ErrNotChat
	}
	for {
		s.ws()
		if s.peek() != '"' {
			return dst[:start], 0, ErrMalformed
		}
		k, _ := s.str()
		s.ws()
		if !s.expect(':') {
			return dst[:start], 0, ErrMalformed
		}
		s.ws()
		switch {
		case k == keyMessages && s.peek() == '[':
			if hasMessages {
				// A repeated key: the last one wins, as in most decoders.
				dst = dst[:start]
			}
			hasMessages, hasPrompt = true, false
			dst = s.messages(dst)
		case k == keyPrompt && promptChunk > 0 && !hasMessages && (s.peek() == '"' || s.peek() == '['):
			dst = dst[:start]
			var ok bool
			dst, ok = s.prompt(dst, promptChunk)
			hasPrompt = hasPrompt || ok
		case k == keyInput && !hasMessages && s.peek() == '[':
			hasMessages = true
			dst = s.messages(dst)
		case k == keyInput && !hasMessages && s.peek() == '"':
			// A single text input: one message.
			before := s.text
			h := s.value(1)
			hasMessages = true
			dst = append(dst, Link{Hash: h, Check: s.text - before})
		case k == keyModel || k == keyTools || k == keySalt || k == keySystem || k == keyInstructions:
			isString := s.peek() == '"'
			v := s.value(1)
			seed = mix(seed, mix(k, v))
			if k == keyModel && isString {
				model = v
			}
		default:
			s.value(1)
		}
		if s.err != nil {
			return dst[:start], 0, s.err
		}
		s.ws()
		if s.peek() == ',' {
			s.i++
			continue
		}
		if !s.expect('}') {
			return dst[:start], 0, ErrMalformed
		}
		break
	}
	s.ws()
	if s.i != len(s.b) {
		return dst[:start], 0, ErrMalformed
	}
	if !hasMessages && !hasPrompt {
		return dst[:start], model, ErrNotChat
	}
	// Fold the per-message hashes into the chain now that the seed is known:
	// "model" may come after "messages" in the body.
	h := seed
	for i := start; i < len(dst); i++ {
		h = mix(h, dst[i].Hash)
		dst[i].Hash = h
		dst[i].Check = uint64(i-start+1)<<40 | dst[i].Check&(1<<40-1)
	}
	return dst, model, nil
}

// ModelKey is the key that AppendRequestChain returns for a body whose
// "model" is name, however the body spells it (escapes decode first).
func ModelKey(name string) uint64 {
	b, _ := json.Marshal(name)
	s := scanner{b: b}
	h, _ := s.str()
	return h
}

// prompt hashes a completions prompt at s.i into dst, one link per chunk
// of decoded bytes (a string) or of token ids (an array of numbers), each
// link's Hash the chunk's own and its Check the bytes or tokens so far; a
// last part shorter than a chunk makes no link. It reports false, having
// skipped the value, for anything else: a batch of prompts is spread.
func (s *scanner) prompt(dst []Link, chunk int) ([]Link, bool) {
	if s.peek() == '[' {
		return s.promptTokens(dst)
	}
	// The string is decoded by str, blocks and all, with its bytes fed
	// to the chunker rather than to one digest.
	s.chunks = chunker{chunk: chunk, dst: dst}
	s.chunks.d.ResetWithSeed(seedString)
	s.chunking = true
	s.str()
	s.chunking = false
	return s.chunks.dst, s.err == nil
}

// chunker cuts decoded prompt bytes into chunks and appends a link per
// whole chunk.
type chunker struct {
	d         xxhash.Digest
	chunk, in int // bytes per chunk, bytes in this one
	total     int
	dst       []Link
}

func (c *chunker) feed(p []byte) {
	for len(p) > 0 {
		take := min(len(p), c.chunk-c.in)
		c.d.Write(p[:take])
		c.in, c.total, p = c.in+take, c.total+take, p[take:]
		if c.in == c.chunk {
			c.dst = append(c.dst, Link{Hash: c.d.Sum64(), Check: uint64(c.total)})
			c.d.ResetWithSeed(seedString)
			c.in = 0
		}
	}
}

// promptTokens is prompt for an array of token ids.
func (s *scanner) promptTokens(dst []Link) ([]Link, bool) {
	save := s.i
	s.i++ // '['
	var h uint64
	n := 0
	for {
		s.ws()
		c := s.peek()
		if c == ']' && n == 0 {
			s.i++
			return dst, true
		}
		if c != '-' && (c < '0' || c > '9') {
			// Not token ids: a batch of prompts, or something else.
			s.i = save
			s.value(1)
			return dst, false
		}
		h = mix(h, s.number())
		if n++; n%promptTokensChunk == 0 {
			dst = append(dst, Link{Hash: h, Check: uint64(n)})
			h = 0
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return dst, true
		default:
			s.fail(ErrMalformed)
			return dst, false
		}
	}
}

// messages hashes each element of the messages array into dst: Hash holds the
// message's own hash and Check the cumulative decoded text length.
func (s *scanner) messages(dst []Link) []Link {
	s.i++ // '['
	s.ws()
	if s.peek() == ']' {
		s.i++
		return dst
	}
	var textLen uint64
	for {
		s.ws()
		before := s.text
		h := s.value(1)
		if s.err != nil {
			return dst
		}
		textLen += s.text - before
		dst = append(dst, Link{Hash: h, Check: textLen})
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return dst
		default:
			s.fail(ErrMalformed)
			return dst
		}
	}
}

// scanner is a single-pass JSON reader that hashes values as it reads them.
// It never allocates: strings are decoded straight into a hash digest.
type scanner struct {
	b    []byte
	i    int
	err  error
	text uint64 // decoded bytes of string values seen, for Link.Check
	// buf gathers decoded string bytes for the digest; it lives here so
	// that it is zeroed once a request, not once a string.
	buf [strBuf]byte
	// chunking sends the decoded bytes of the next str to chunks, a
	// completions prompt's links, rather than to its digest (prompt).
	chunking bool
	chunks   chunker
}

// write gives decoded string bytes to str's digest d, or to the prompt's
// chunker: one well-predicted branch a kilobyte.
func (s *scanner) write(d *xxhash.Digest, p []byte) {
	if s.chunking {
		s.chunks.feed(p)
		return
	}
	d.Write(p)
}

// strBuf is the size of the scanner's buffer of decoded bytes: the digest
// is written most of a kilobyte at a time, and decodeDense returns to str
// to empty the buffer once every dozen blocks or so (512 bytes made that
// every five blocks, and the code-like body 5% slower).
const strBuf = 1024

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
		if s.peek() != '"' {
			s.fail(ErrMalformed)
			return 0
		}
		k, _ := s.str()
		s.ws()
		if !s.expect(':') {
			return 0
		}
		s.ws()
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
// hashes is the string's canonical spelling (strCanon), except for a
// completions prompt, whose decoded bytes it gives to the chunker: the
// decoding path below. Decoded bytes gather in a stack buffer so that the
// digest sees few large writes. Two ways to find the bytes that end a plain
// run (a backslash or the closing quote) take turns, chosen by the length
// of the last run: a long run (prose) is found with bytes.IndexByte,
// vectorized; short runs (source code in a prompt, with an escape every
// dozen bytes) are decoded by decodeDense, a block of 64 bytes at a time,
// with no call per run.
func (s *scanner) str() (uint64, int) {
	b := s.b
	i := s.i + 1 // past '"'
	// A short string without escapes (a key, a role, a model name: most
	// strings of a small request) is found by bit arithmetic on its first
	// 32 bytes and hashed in one pass, without a digest, a search call or
	// a copy.
	if !s.chunking {
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
			// The body's last 32 bytes, where its last strings are
			// (a chat's last message, a role): a byte at a time.
			for j := i; j < len(b) && b[j] != '\\'; j++ {
				if b[j] == '"' {
					s.i = j + 1
					return sum64Short(b[i:j]), j - i
				}
			}
		}
		return s.strCanon()
	}
	var d xxhash.Digest
	d.ResetWithSeed(seedString)
	buf := &s.buf
	nb, n := 0, 0 // bytes in buf; decoded bytes so far
	q := -1       // the next quote at or after i, in sparse mode
	dense := false
	for {
		if dense {
			for {
				nb, i = decodeDense(buf, nb, b, i)
				if nb <= len(buf)-blockOut {
					break
				}
				s.write(&d, buf[:nb])
				n += nb
				nb = 0
			}
			// decodeDense stopped at a quote, at an escape that is
			// the general decoder's, or near the end of the body.
			for i < len(b) && b[i] != '"' && b[i] != '\\' {
				if nb == len(buf) {
					s.write(&d, buf[:nb])
					n += nb
					nb = 0
				}
				buf[nb] = b[i]
				nb++
				i++
			}
			if i >= len(b) {
				s.fail(ErrMalformed)
				return 0, 0
			}
			if b[i] == '"' {
				s.i = i + 1
				s.write(&d, buf[:nb])
				return d.Sum64(), n + nb
			}
		} else {
			if q < i {
				q = bytes.IndexByte(b[i:], '"')
				if q < 0 {
					s.fail(ErrMalformed)
					return 0, 0
				}
				q += i
			}
			end := q
			if bs := bytes.IndexByte(b[i:q], '\\'); bs >= 0 {
				end = i + bs
			}
			if run := b[i:end]; nb+len(run) <= len(buf) {
				nb += copy(buf[nb:], run)
			} else {
				s.write(&d, buf[:nb])
				n += nb
				nb = 0
				s.write(&d, run)
				n += len(run)
			}
			dense = end-i < denseRun
			i = end
			if end == q {
				s.i = q + 1
				s.write(&d, buf[:nb])
				return d.Sum64(), n + nb
			}
		}
		// b[i] is a backslash.
		if nb+4 > len(buf) {
			s.write(&d, buf[:nb])
			n += nb
			nb = 0
		}
		if i+1 < len(b) {
			if c := unescape[b[i+1]]; c != 0 {
				buf[nb] = c
				nb++
				i += 2
				continue
			}
		}
		s.i = i
		m := s.escape((*[4]byte)(buf[nb : nb+4]))
		if s.err != nil {
			return 0, 0
		}
		nb += m
		i = s.i
	}
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
				d.Write(s.buf[:nb])
			}
			d.Write(b[from:j])
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
		d.Write(s.buf[:nb])
		nb = 0
		if len(p) >= 256 {
			d.Write(p)
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

// denseRun is the run length below which str decodes blocks rather than
// search: a run this short costs more to find with a call than to copy.
const denseRun = 64

// blockIn and blockOut are the bytes of body and of buffer that one block
// of decodeDense may touch: 64 bytes, the byte after a backslash in the
// last of them, and a 64-byte copy from there.
const blockIn, blockOut = 2*64 + 1, 2 * 64

// decodeDense decodes the string body b[i:] into buf[nb:] and returns the
// new nb and i. It stops at a closing quote, at a backslash whose escape
// is not one byte (\u, or no escape: the general decoder's), or when buf
// has less than blockOut bytes of room; i is then at the quote or the
// backslash, or at the first byte not decoded. Within blockIn bytes of the
// end of b it leaves the rest to decodeWords.
//
// A block is the next 64 bytes. Bit arithmetic finds all its quotes and
// backslashes at once, as a 64-bit mask; the block is copied to buf whole,
// and at each escape the decoded byte is written over the backslash's place
// and the rest of the block copied again, 64 bytes, one place further
// down. No branch depends on where the escapes are or how long the runs
// between them are: in code, with an escape every dozen bytes, such a
// branch would be mispredicted at each one, and a call per run (as with
// bytes.IndexByte) would cost more than the run.
func decodeDense(buf *[strBuf]byte, nb int, b []byte, i int) (int, int) {
	for nb <= len(buf)-blockOut {
		if i > len(b)-blockIn {
			return decodeWords(buf, nb, b, i)
		}
		blk := b[i : i+blockIn]
		out := buf[nb : nb+blockOut]
		m := specials64((*[64]byte)(blk[:64]))
		copy64((*[64]byte)(out[:64]), (*[64]byte)(blk[:64]))
		r, o := 0, 0 // bytes of the block read, bytes written
		for m != 0 {
			p := trailingZeros(m) & 63
			c, e := blk[p], unescape[blk[p+1]]
			o += p - r
			if c == '"' || e == 0 {
				return nb + o, i + p
			}
			out[o] = e
			o++
			r = p + 2
			m &^= 3 << uint(p) // the backslash and the byte it escapes
			copy64((*[64]byte)(out[o:o+64]), (*[64]byte)(blk[r:r+64]))
		}
		end := max(r, 64) // past the block, or past an escape that ends it
		nb += o + end - r
		i += end
	}
	return nb, i
}

// decodeWords is decodeDense for the last bytes of a body, where a block
// would read past its end: sixteen bytes a step, copied whole, with the
// first quote or backslash among them found by bit arithmetic. It stops
// where decodeDense does, when fewer than 18 bytes of b remain, or when
// buf has less than 17 bytes of room.
func decodeWords(buf *[strBuf]byte, nb int, b []byte, i int) (int, int) {
	for nb <= len(buf)-17 && i <= len(b)-18 {
		w1 := binary.LittleEndian.Uint64(b[i:])
		w2 := binary.LittleEndian.Uint64(b[i+8:])
		binary.LittleEndian.PutUint64(buf[nb:], w1)
		binary.LittleEndian.PutUint64(buf[nb+8:], w2)
		k1 := uint(bits.TrailingZeros64(special(w1))) >> 3 // 8: none
		k2 := uint(bits.TrailingZeros64(special(w2))) >> 3
		k := k1 + k2*(k1>>3) // the first special byte; 16: none
		hit := 1 - k>>4      // 1 if there is one
		c, e := b[i+int(k)], unescape[b[i+int(k)+1]]
		// Stop at a special byte that is a quote, or a backslash that
		// starts no one-byte escape (e == 0).
		if hit&((uint(c^'\\')+0xFF)>>8|(uint(e)-1)>>63) != 0 {
			return nb + int(k), i + int(k)
		}
		buf[nb+int(k)] = e // past the copied bytes when there is none
		nb += int(k + hit)
		i += int(k + 2*hit)
	}
	return nb, i
}

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

// copy64 copies 64 bytes, 16 at a time: the compiler would make a call to
// memmove of a [64]byte or [32]byte assignment (they may overlap), and
// moves a [16]byte with one SSE load and one store. A word at a time
// through encoding/binary took eight loads, eight stores and sixteen
// inlining marks (XCHGL AX, AX) that the CPU executes; the code-like body
// went from 978 to 1064 MB/s (CPU time, medians of 5).
func copy64(d, s *[64]byte) {
	*(*[16]byte)(d[0:16]) = *(*[16]byte)(s[0:16])
	*(*[16]byte)(d[16:32]) = *(*[16]byte)(s[16:32])
	*(*[16]byte)(d[32:48]) = *(*[16]byte)(s[32:48])
	*(*[16]byte)(d[48:64]) = *(*[16]byte)(s[48:64])
}

// trailingZeros is bits.TrailingZeros64 for a nonzero m, as a count of
// the bits below the lowest set one: bits.TrailingZeros64 is BSF and CMOV
// on amd64 below GOAMD64=v3, and decodeDense was 7% slower with it on the
// code-like body (AMD EPYC).
func trailingZeros(m uint64) int {
	return bits.OnesCount64(^m & (m - 1))
}

// unescape maps the byte after a backslash to what it stands for, for the
// one-byte escapes; 0 for \u and for bytes that make no escape.
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

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
