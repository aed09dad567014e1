package prefixcache

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"math/rand"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// strReference is str as it was before its dense path: the reference that
// str must agree with. It hashes the string at s.i by its decoded content and reports its
// decoded length. Plain runs are found with bytes.IndexByte (vectorized):
// the closing quote once, then each backslash before it. Decoded bytes
// gather in a stack buffer so that the digest sees few large writes, not
// one per escape: source code in a prompt has an escape every dozen bytes.
func (s *scanner) strReference() (uint64, int) {
	var d xxhash.Digest
	d.ResetWithSeed(seedString)
	buf := &s.buf
	nb, n := 0, 0
	b := s.b
	i := s.i + 1 // past '"'
	q := -1      // the next quote at or after i
	for {
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
			n += len(run)
		} else {
			d.Write(buf[:nb])
			nb = 0
			d.Write(run)
			n += len(run)
		}
		if end == q {
			s.i = q + 1
			d.Write(buf[:nb])
			return d.Sum64(), n
		}
		if nb+4 > len(buf) {
			d.Write(buf[:nb])
			nb = 0
		}
		s.i = end
		m := s.escape((*[4]byte)(buf[nb : nb+4]))
		if s.err != nil {
			return 0, 0
		}
		nb += m
		n += m
		i = s.i
	}
}

// strPrevious is str as it was before decodeDense (commits e68643d to
// f60016d): its dense path copied one word a step and branched on where the
// first quote or backslash in it was. It is the second reference, and the
// baseline of BenchmarkStr; it gathers in s.buf as str does, which was 512
// bytes then and is strBuf now.
func (s *scanner) strPrevious() (uint64, int) {
	var d xxhash.Digest
	d.ResetWithSeed(seedString)
	buf := &s.buf
	nb, n := 0, 0 // bytes in buf; decoded bytes so far
	b := s.b
	i := s.i + 1 // past '"'
	q := -1      // the next quote at or after i, in sparse mode
	dense := false
	for {
		if dense {
			// Copy words while they hold neither '"' nor '\\', and
			// decode one-byte escapes in the same loop.
			for i+8 <= len(b) {
				if nb+9 > len(buf) {
					d.Write(buf[:nb])
					n += nb
					nb = 0
				}
				w := binary.LittleEndian.Uint64(b[i:])
				binary.LittleEndian.PutUint64(buf[nb:], w)
				m := special(w)
				if m == 0 {
					nb += 8
					i += 8
					continue
				}
				k := bits.TrailingZeros64(m) >> 3
				nb += k
				i += k
				if b[i] == '"' {
					s.i = i + 1
					d.Write(buf[:nb])
					return d.Sum64(), n + nb
				}
				if i+1 == len(b) {
					break // a backslash at the very end: malformed
				}
				c := unescape[b[i+1]]
				if c == 0 {
					break // \u, or not an escape: the general decoder's
				}
				buf[nb] = c
				nb++
				i += 2
			}
			for i < len(b) && b[i] != '"' && b[i] != '\\' {
				if nb == len(buf) {
					d.Write(buf[:nb])
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
				d.Write(buf[:nb])
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
				d.Write(buf[:nb])
				n += nb
				nb = 0
				d.Write(run)
				n += len(run)
			}
			dense = end-i < denseRun
			i = end
			if end == q {
				s.i = q + 1
				d.Write(buf[:nb])
				return d.Sum64(), n + nb
			}
		}
		// b[i] is a backslash.
		if nb+4 > len(buf) {
			d.Write(buf[:nb])
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

// strCases are JSON strings (quotes included) of every shape str handles:
// dense and sparse escapes, runs across word and buffer boundaries, \u
// escapes and surrogates, and unterminated ones.
func strCases() []string {
	cases := []string{`""`, `"a"`, `"\""`, `"\\"`, `"abc\n"`, `"\u00e9\ud83d\ude00x"`, `"\ud800"`, `"unterminated`, `"a\`, `"\x"`}
	for k := 0; k < 24; k++ { // a backslash at the very end, at every offset of a word
		// The escaped quote is the only one: the search for the closing
		// quote stops there, and the words after it reach the end.
		cases = append(cases, `"\n\"`+strings.Repeat("a", k)+`\`, `"\n\"`+strings.Repeat("a", k)+`\n`)
	}
	// Escapes, quotes and \u at every place of a block and across its
	// end: decodeDense reads 64 bytes at a time from where it stands.
	for k := 0; k < 140; k++ {
		pre := strings.Repeat("x", k)
		for _, esc := range []string{`\n`, `\\`, `\"`, `\u00e9`, `\ud83d\ude00`, `\\\"`, `"`, `\`, `\q`, `\u12`, `\/`, `\u0022\/\n`} {
			cases = append(cases, `"`+pre+esc+`ab\tcd"`, `"\n`+pre+esc+strings.Repeat(`y\n`, 40)+`"`)
		}
	}
	rng := rand.New(rand.NewSource(1))
	parts := []string{"x", "func main() {", "\\n", "\\t", "\\\"", "\\\\", "\\u0041", "\\/", "é", "€", " "}
	for n := 0; n < 2000; n++ {
		var b bytes.Buffer
		b.WriteByte('"')
		for k := rng.Intn(200); k > 0; k-- {
			p := parts[rng.Intn(len(parts))]
			if rng.Intn(4) == 0 {
				p = string(bytes.Repeat([]byte{'a' + byte(rng.Intn(26))}, rng.Intn(700)))
			}
			b.WriteString(p)
		}
		b.WriteByte('"')
		cases = append(cases, b.String())
	}
	return cases
}

// str agrees with the reference on every case: same hash, same decoded
// length, same position after the string, same error.
func TestStrMatchesReference(t *testing.T) {
	for _, c := range strCases() {
		checkStr(t, []byte(c))
		checkStr(t, []byte(c+",rest"))
		checkStr(t, []byte(c+tail))
	}
}

// sum64Short hashes every length below 32 as a digest reset with
// seedString does.
func TestSum64Short(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for n := 0; n < 32; n++ {
		for k := 0; k < 50; k++ {
			p := make([]byte, n)
			rng.Read(p)
			var d xxhash.Digest
			d.ResetWithSeed(seedString)
			d.Write(p)
			if got, want := sum64Short(p), d.Sum64(); got != want {
				t.Fatalf("%x: sum64Short = %x, digest %x", p, got, want)
			}
		}
	}
}

// Text renders as its canonical spelling, through strCanon as a hashed
// string does, with its links where the reference puts them.
func TestStreamMatchesReference(t *testing.T) {
	for _, c := range strCases() {
		checkStream(t, []byte(c))
		checkStream(t, []byte(c+tail))
	}
}

// tail follows a string in a body so that strCanon has room for whole
// blocks up to its end and past it; its quotes and backslashes are not
// the string's.
var tail = `,"` + strings.Repeat(`a\"b\\c\n`, 30) + `"}` + strings.Repeat(" ", 200)

// specials64 marks exactly the quotes and backslashes of a block: every
// byte value at every place, between bytes that borrow and carry (0x00,
// 0xFF, and the bytes next to '"' and '\\').
func TestSpecials64(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	fill := []byte{0, 0xFF, '"', '\\', '"' - 1, '"' + 1, '\\' - 1, '\\' + 1, 'a', 0x80, 0x7F}
	var p [64]byte
	for n := 0; n < 300; n++ {
		for j := range p {
			if n%2 == 0 {
				p[j] = fill[rng.Intn(len(fill))]
			} else {
				p[j] = byte(rng.Intn(256))
			}
		}
		for j := range p {
			save := p[j]
			for c := 0; c < 256; c += 1 + 16*(n%4) {
				p[j] = byte(c)
				var want uint64
				for k, v := range p {
					if v == '"' || v == '\\' {
						want |= 1 << k
					}
				}
				if got := specials64(&p); got != want {
					t.Fatalf("specials64(%q) = %064b, want %064b", p, got, want)
				}
			}
			p[j] = save
		}
	}
}

// canonReference is strCanon a byte at a time: the string at s.i spelled
// canonically (a body byte as itself; an escape decoded by escape, and a
// decoded byte with a one-letter escape in that spelling) into one slice,
// hashed whole.
func (s *scanner) canonReference() (uint64, int) {
	var spelled []byte
	n := 0
	s.i++
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch c {
		case '"':
			s.i++
			var d xxhash.Digest
			d.ResetWithSeed(seedString)
			d.Write(spelled)
			return d.Sum64(), n
		case '\\':
			var t [4]byte
			k := s.escape(&t)
			if s.err != nil {
				return 0, 0
			}
			n += k
			for _, c := range t[:k] {
				switch c {
				case '"', '\\':
					spelled = append(spelled, '\\', c)
				case '\n':
					spelled = append(spelled, `\n`...)
				case '\t':
					spelled = append(spelled, `\t`...)
				case '\r':
					spelled = append(spelled, `\r`...)
				case '\b':
					spelled = append(spelled, `\b`...)
				case '\f':
					spelled = append(spelled, `\f`...)
				default:
					spelled = append(spelled, c)
				}
			}
		default:
			spelled = append(spelled, c)
			n++
			s.i++
		}
	}
	s.fail(ErrMalformed)
	return 0, 0
}

// checkStr checks str against canonReference, and its decoded length and
// where it stops against the two decoders before it. Where a string is
// malformed, only the error is compared: the place is of no use then.
func checkStr(t *testing.T, b []byte) {
	t.Helper()
	a, c, r, p := scanner{b: b}, scanner{b: b}, scanner{b: b}, scanner{b: b}
	ha, na := a.str()
	hc, nc := c.canonReference()
	if a.err != c.err || a.err == nil && (ha != hc || na != nc || a.i != c.i) {
		t.Fatalf("%q: str = %x %d at %d (%v), canonical reference %x %d at %d (%v)", b, ha, na, a.i, a.err, hc, nc, c.i, c.err)
	}
	_, nr := r.strReference()
	if a.err != r.err || a.err == nil && (na != nr || a.i != r.i) {
		t.Fatalf("%q: str = %d at %d (%v), reference %d at %d (%v)", b, na, a.i, a.err, nr, r.i, r.err)
	}
	if _, np := p.strPrevious(); a.err != p.err || a.err == nil && (na != np || a.i != p.i) {
		t.Fatalf("%q: str = %d at %d (%v), previous %d at %d (%v)", b, na, a.i, a.err, np, p.i, p.err)
	}
}

// unescape is the byte that a one-letter escape stands for, 0 for none
// (strPrevious).
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// canonicalReference is the canonical spelling of the string at b[0], by
// way of its decoded bytes (strReference's loop): what the rendering of
// the string must be, and the decoded string's length.
func canonicalReference(b []byte) ([]byte, bool) {
	s := scanner{b: b}
	var out []byte
	var esc [4]byte
	i := 1
	for {
		j := bytes.IndexAny(b[i:], "\"\\")
		if j < 0 {
			return nil, false
		}
		j += i
		out = append(out, b[i:j]...)
		if b[j] == '"' {
			return out, true
		}
		s.i = j
		m := s.escape(&esc)
		if s.err != nil {
			return nil, false
		}
		for _, c := range esc[:m] {
			if l := canonicalLetter[c]; l != 0 && m == 1 {
				out = append(out, '\\', l)
			} else {
				out = append(out, c)
			}
		}
		i = s.i
	}
}

// checkStream checks that a string rendered as text (renderString) takes
// its links where its canonical spelling's chunk boundaries fall, each the
// hash of the spelling up to there, for chunks of several sizes.
func checkStream(t *testing.T, b []byte) {
	t.Helper()
	want, ok := canonicalReference(b)
	for _, chunk := range []int{7, 64, 1024} {
		s := scanner{b: b}
		s.r.reset(chunk)
		s.renderString()
		if (s.err == nil) != ok {
			t.Fatalf("%q: rendering error %v, reference ok %v", b, s.err, ok)
		}
		if !ok {
			continue
		}
		if len(s.r.blocks) != len(want)/chunk || s.r.pos != len(want) {
			t.Fatalf("%q, chunk %d: %d links over %d bytes, want %d over %d", b, chunk, len(s.r.blocks), s.r.pos, len(want)/chunk, len(want))
		}
		for k, l := range s.r.blocks {
			if h := xxhash.Sum64(want[:(k+1)*chunk]); l.Hash != h || l.Check != uint64((k+1)*chunk) {
				t.Fatalf("%q, chunk %d: link %d = %x, want the spelling's hash %x at %d", b, chunk, k, l, h, (k+1)*chunk)
			}
		}
	}
}

func FuzzStr(f *testing.F) {
	for _, c := range strCases()[:50] {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 && b[0] == '"' {
			checkStr(t, b)
			// A fuzzed string is short: a tail gives strCanon room
			// for blocks.
			withTail := append(b[:len(b):len(b)], tail...)
			checkStr(t, withTail)
			checkStream(t, b)
			checkStream(t, withTail)
		}
	})
}
