package router

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// FuzzChunkedRelay feeds arbitrary bytes to the proxy as a replica's chunked
// body. The proxy must not panic or hang, and when the bytes are valid
// chunked encoding, the client must get exactly what they decode to.
func FuzzChunkedRelay(f *testing.F) {
	var mu sync.Mutex
	var current []byte
	url := rawReplica(f, false, func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return append([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"), current...)
	})
	p := startProxy(f, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.FirstByteTimeout, u.StreamIdleTimeout = 2*time.Second, 2*time.Second
		u.Cooldown = time.Millisecond
	})
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"))
	f.Add([]byte("5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n"))
	f.Add([]byte("a\r\ndata: x\n\n\r\n"))
	f.Add([]byte("zz\r\n"))
	f.Add([]byte("3\r\nabcd\r\n0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		mu.Lock()
		current = body
		mu.Unlock()
		want, refErr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(body)))
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Post(p.url("/v1/chat/completions"), "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("the proxy did not answer: %v", err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if refErr == nil && isStrictChunked(body) {
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("valid chunked body relayed as %q (%v), want %q", got, err, want)
			}
		}
		// Invalid encodings may be relayed up to the fault and cut, or
		// read leniently (bare LF line ends, as RFC 9112 §2.2 allows); the
		// proxy must only answer, which the next input checks.
	})
}

// isStrictChunked reports whether body is chunked encoding that both
// decoders must accept: hex sizes, CRLFs, a last chunk and the final CRLF,
// nothing after it.
func isStrictChunked(body []byte) bool {
	br := bufio.NewReader(bytes.NewReader(body))
	for {
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasSuffix(line, "\r\n") {
			return false
		}
		line = strings.TrimSuffix(line, "\r\n")
		if i := strings.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		var n int
		if line == "" || len(line) > 8 {
			return false
		}
		for _, c := range line {
			switch {
			case c >= '0' && c <= '9':
				n = n*16 + int(c-'0')
			case c >= 'a' && c <= 'f':
				n = n*16 + int(c-'a'+10)
			case c >= 'A' && c <= 'F':
				n = n*16 + int(c-'A'+10)
			default:
				return false
			}
		}
		if n == 0 {
			rest, _ := io.ReadAll(br)
			return string(rest) == "\r\n"
		}
		data := make([]byte, n+2)
		if _, err := io.ReadFull(br, data); err != nil || string(data[n:]) != "\r\n" {
			return false
		}
	}
}
