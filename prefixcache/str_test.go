package prefixcache

import (
	"bytes"
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
	}
}

func checkStr(t *testing.T, b []byte) {
	t.Helper()
	a, r := scanner{b: b}, scanner{b: b}
	ha, na := a.str()
	hr, nr := r.strReference()
	if ha != hr || na != nr || a.i != r.i || a.err != r.err {
		t.Fatalf("%q: str = %x %d at %d (%v), reference %x %d at %d (%v)", b, ha, na, a.i, a.err, hr, nr, r.i, r.err)
	}
}

func FuzzStr(f *testing.F) {
	for _, c := range strCases()[:50] {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 && b[0] == '"' {
			checkStr(t, b)
		}
	})
}
