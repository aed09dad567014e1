package router

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// An HTTP/1.0 client that keeps its connection alive gets each chunked
// answer whole, framed by its length (it cannot read chunks, nor an end of
// connection it asked to keep), with the connection kept for its next
// request; the chunked answer's trailers, dropped, do not turn up among
// its headers.
func TestHTTP10KeepAliveClientOfChunkedAnswers(t *testing.T) {
	url := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n6\r\ndata: \r\n3\r\nok\n\r\n0\r\nX-Sum: 1\r\n\r\n")
	})
	p := startProxy(t, Adaptive, []string{url})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	body := chat(1, 1)
	for i := 0; i < 3; i++ {
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 || string(got) != "data: ok\n" || resp.ContentLength != 9 || resp.Close {
			t.Fatalf("answer %d: %d %q %v, length %d, close %v; want 200 %q framed by its length, kept", i, resp.StatusCode, got, err, resp.ContentLength, resp.Close, "data: ok\n")
		}
		if len(resp.TransferEncoding) != 0 || resp.Header.Get("X-Sum") != "" || resp.Header.Get("Trailer") != "" {
			t.Fatalf("answer %d: chunked framing or its trailers reached an HTTP/1.0 client: %v %v", i, resp.TransferEncoding, resp.Header)
		}
	}
	settled(t, p)
}
