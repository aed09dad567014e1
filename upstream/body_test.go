package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http/httputil"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Body undoes each framing of an answer's body: chunks, with extensions and
// trailers, a length, or the replica's close. A malformed or cut body is
// an error in PhaseStream, with what came before it read; a connection is
// pooled again only after a body read whole to its end, with nothing after
// it.
func TestBody(t *testing.T) {
	const chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
	for _, tt := range []struct {
		name, answer string
		close        bool   // the replica closes after the answer
		want         string // the body, or what comes before the error
		trailer      string // X-Sum's value
		err          bool
		sign         Sign
		pooled       bool
	}{
		{name: "chunked", answer: chunked + "\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", want: "hello world", pooled: true},
		{name: "chunk extensions", answer: chunked + "\r\n5;ext=1\r\nhello\r\n6;a=b;c=\"d\"\r\n world\r\n0;last\r\n\r\n", want: "hello world", pooled: true},
		{name: "trailers", answer: chunked + "Trailer: X-Sum\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n", want: "abc", trailer: "1", pooled: true},
		{name: "forbidden trailers", answer: chunked + "\r\n3\r\nabc\r\n0\r\nContent-Length: 5\r\n\r\n", want: "abc"},
		{name: "trailers cut", answer: chunked + "Trailer: X-Sum\r\n\r\n3\r\nabc\r\n0\r\nX-Su", close: true, want: "abc", err: true},
		{name: "a chunk longer than its size", answer: chunked + "\r\n5\r\nhelloXX\r\n0\r\n\r\n", want: "hello", err: true},
		{name: "a size that is not hex", answer: chunked + "\r\n3\r\nabc\r\nzz\r\n", want: "abc", err: true},
		{name: "chunks cut", answer: chunked + "\r\n5\r\nhel", close: true, want: "hel", err: true},
		{name: "chunks that stop", answer: chunked + "\r\n3\r\nabc\r\n", want: "abc", err: true, sign: SignTimeout},
		{name: "until the replica closes", answer: "HTTP/1.1 200 OK\r\n\r\nabc", close: true, want: "abc"},
		{name: "length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", want: "hello", pooled: true},
		{name: "length, bytes after it", answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA", want: "hello"},
		{name: "length 0", answer: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", pooled: true},
		{name: "length cut", answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", close: true, want: "abc", err: true},
	} {
		for _, size := range []int{1, 3, 4096} {
			r := startTestReplica(t, Config{StreamIdleTimeout: 200 * time.Millisecond})
			r.afterStreams.Store(streamsKept) // as if seen (TestReplicaThatKeepsStreamConns)
			c, srv := r.connect(t)
			b, hd := streamAnswer(t, c, srv, tt.answer, tt.close)
			got, err := readAll(b, size)
			if string(got) != tt.want {
				t.Errorf("%s, reads of %d: body %q, want %q", tt.name, size, got, tt.want)
			}
			var e *Error
			if tt.err != (err != nil) || err != nil && (!errors.As(err, &e) || e.Phase != PhaseStream || e.Sign != tt.sign) {
				t.Errorf("%s, reads of %d: error %v, want one %v (a %v in PhaseStream)", tt.name, size, err, tt.err, tt.sign)
			}
			if got := string(hd.Peek("X-Sum")); got != tt.trailer {
				t.Errorf("%s, reads of %d: trailer X-Sum %q, want %q", tt.name, size, got, tt.trailer)
			}
			c.Release(time.Now())
			if pooled := len(r.idle) == 1; pooled != tt.pooled {
				t.Errorf("%s, reads of %d: pooled %v, want %v", tt.name, size, pooled, tt.pooled)
			}
		}
	}
}

// Ready reports whether a body's first Read returns bytes without a wait:
// some are buffered, after a whole and valid size line when chunked, and
// not the last chunk's (its trailers may come later).
func TestBodyReady(t *testing.T) {
	for _, tt := range []struct {
		buffered string
		chunked  bool
		want     bool
	}{
		{"", false, false},
		{"x", false, true},
		{"", true, false},
		{"9\r", true, false},
		{"9\r\n", true, false},
		{"9\r\nd", true, true},
		{"1a;ext=1\r\nd", true, true},
		{"10\r\nd", true, true},
		{"0\r\n\r\n", true, false},
		{"00;ext\r\n\r\n", true, false},
		{"1X0\n0", true, false},
		{"\r\nd", true, false},
	} {
		head := "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
		if tt.chunked {
			head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
		}
		c, srv := startTestReplica(t, Config{}).connect(t)
		b, _ := streamAnswer(t, c, srv, head+tt.buffered, false)
		if c.Buffered() != len(tt.buffered) {
			t.Fatalf("%q: %d bytes buffered", tt.buffered, c.Buffered())
		}
		if got := b.Ready(); got != tt.want {
			t.Errorf("%q (chunked %v): Ready = %v, want %v", tt.buffered, tt.chunked, got, tt.want)
		}
	}
}

func TestChunkSize(t *testing.T) {
	for _, tt := range []struct {
		line string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1a", 26, true}, {"1A", 26, true}, {"123456789abcdef", 0x123456789abcdef, true},
		{"5;ext=1", 5, true}, {" 5 ", 5, true}, {"", 0, false}, {"g", 0, false}, {"-1", 0, false}, {"0x5", 0, false},
		{"123456789abcdef0", 0, false}, {";ext", 0, false},
	} {
		got, err := chunkSize([]byte(tt.line))
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("chunkSize(%q) = %d, %v; want %d (valid %v)", tt.line, got, err, tt.want, tt.ok)
		}
	}
}

// chunkSize's one-pass reading of a size line agrees with strconv's.
func FuzzChunkSize(f *testing.F) {
	for _, line := range []string{"0", "5", "1a", "1A", "fFfF", "123456789abcdef", "123456789abcdef0",
		"", " 5", "5 ", "5;ext=1", "g", "-1", "+1", "0x5", "\t5\t", "_1"} {
		f.Add([]byte(line))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		got, gotErr := chunkSize(line)
		s := string(line)
		if i := strings.IndexByte(s, ';'); i >= 0 {
			s = s[:i]
		}
		s = strings.TrimSpace(s)
		want, wantErr := strconv.ParseInt(s, 16, 64)
		if len(s) > 15 || strings.ContainsAny(s, "+-_") {
			want, wantErr = 0, errBadChunk
		}
		if wantErr != nil {
			want = 0
		}
		if got != want || (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("chunkSize(%q) = %d, %v; strconv reads %d, %v", line, got, gotErr, want, wantErr)
		}
	})
}

// longSize is a chunk size of 16 hex digits or more, which the reference
// takes and chunkSize refuses: none is a body that a replica sends.
var longSize = regexp.MustCompile(`(^|\n)[0-9a-fA-F]{16}`)

// FuzzBody reads arbitrary bytes as a replica's chunked body, coming in
// pieces of every size and read with buffers of every size. Body must not
// panic or hang, and a body that net/http's chunked reader decodes, ended
// by the last chunk and an empty trailer section, must read as the same
// bytes. Over net.Pipe each read of the connection returns what one write
// gave, so the pieces are exactly as the input says.
func FuzzBody(f *testing.F) {
	for _, body := range []string{
		"5\r\nhello\r\n0\r\n\r\n",
		"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: x\r\n\r\n",
		"a\r\ndata: x\n\n\r\n0\r\n\r\n",
		"zz\r\n",
		"3\r\nabcd\r\n0\r\n\r\n",
		"3\nabc\n0\n\n",
		"1\r\na\r\n1\r\nb\r\n1\r\nc\r\n0\r\n\r\n",
	} {
		for _, piece := range []uint8{0, 3, 16} {
			f.Add([]byte(body), piece, uint8(2))
			f.Add([]byte(body), piece, uint8(63))
		}
	}
	s, err := NewSet([]string{"127.0.0.1:1"}, Config{FirstByteTimeout: 5 * time.Second, StreamIdleTimeout: 5 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	r := s.Replica(0)
	f.Fuzz(func(t *testing.T, body []byte, piece, readSize uint8) {
		proxyEnd, replicaEnd := net.Pipe()
		defer proxyEnd.Close()
		c := newConn(proxyEnd, r)
		go func() {
			defer replicaEnd.Close()
			if _, err := http1Request(replicaEnd); err != nil {
				return
			}
			answer := append([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), body...)
			for n := int(piece)%17 + 1; len(answer) > 0; answer = answer[min(n, len(answer)):] {
				if _, err := replicaEnd.Write(answer[:min(n, len(answer))]); err != nil {
					return
				}
			}
		}()
		var hd fasthttp.ResponseHeader
		if err := c.RoundTrip([]byte("GET / HTTP/1.1\r\nHost: r\r\n\r\n"), nil, &hd, nil, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		got, err := readAll(c.Stream(hd.ContentLength(), nil, &hd), int(readSize)%64+1)
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("an error that is not an *Error: %v", err)
		}
		ref := bufio.NewReader(bytes.NewReader(body))
		want, refErr := io.ReadAll(httputil.NewChunkedReader(ref))
		rest, _ := io.ReadAll(ref)
		if refErr == nil && string(rest) == "\r\n" && !longSize.Match(body) {
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("a valid chunked body read as %q (%v), want %q", got, err, want)
			}
		}
	})
}

// http1Request reads one request head from c.
func http1Request(c net.Conn) (*fasthttp.RequestHeader, error) {
	var h fasthttp.RequestHeader
	return &h, h.Read(bufio.NewReader(c))
}
