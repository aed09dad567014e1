package router

import (
	"bufio"
	"io"
	"strings"
	"sync/atomic"
	"testing"
)

// An answer with both Content-Length and Transfer-Encoding: chunked is
// framed by its chunks (RFC 9112 6.3), and relayed without the
// Content-Length that contradicts them: a client that trusted the length
// would take the chunks' framing for body and misread the next answer on
// the connection, pipelined here behind it.
func TestLengthAndChunkedAnswerIsFramedByItsChunks(t *testing.T) {
	var n atomic.Int64
	url := rawReplica(t, true, func() []byte {
		if n.Add(1) == 1 {
			return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
		}
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\n[{}]")
	})
	p := startProxy(t, RoundRobin, []string{url})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), "")+rawChat(chat(2, 1), ""))
	var head strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("head %q: %v", head.String(), err)
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
	}
	h := strings.ToLower(head.String())
	if !strings.HasPrefix(h, "http/1.1 200") || strings.Contains(h, "content-length:") || !strings.Contains(h, "transfer-encoding: chunked") {
		t.Fatalf("head %q: want a 200 framed by chunks alone", head.String())
	}
	// The head was read above; the body and the next answer are read
	// through one reader, behind a head that says what the client saw.
	rest := bufio.NewReader(io.MultiReader(strings.NewReader("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), br))
	if _, got := readAnswer(t, rest, "POST"); got != "{}" {
		t.Fatalf("body %q, want {}", got)
	}
	if resp, got := readAnswer(t, rest, "POST"); resp.StatusCode != 200 || got != "[{}]" {
		t.Fatalf("the next answer: %d %q", resp.StatusCode, got)
	}
	settled(t, p)
}
