package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// streamRequest is a raw HTTP/1.1 request for a chat stream, with extra
// header lines.
func streamRequest(extra string) string {
	body := chat(1, 3)
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// readStream reads one answer from br and checks that it is the stream of
// n events that sse(n, nil) sends.
func readStream(t *testing.T, br *bufio.Reader, n int) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || strings.Count(string(got), "data: ") != n+1 || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Fatalf("stream body %q, %v", got, err)
	}
	return resp
}

func dialProxy(t *testing.T, p *proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// A relayed stream's connection goes back to the server when the stream
// ends: the client's next request on it is served, whether it comes after
// the stream or was sent with the first request (pipelined, read by
// fasthttp before the relay took the connection over).
func TestRelayedConnectionServesAgain(t *testing.T) {
	a := startReplica(t, "a", sse(3, nil))
	p := startProxy(t, RoundRobin, []string{a.url()})
	t.Run("after", func(t *testing.T) {
		c := dialProxy(t, p)
		br := bufio.NewReader(c)
		for i := 0; i < 3; i++ {
			if _, err := io.WriteString(c, streamRequest("")); err != nil {
				t.Fatal(err)
			}
			readStream(t, br, 3)
		}
	})
	t.Run("pipelined", func(t *testing.T) {
		c := dialProxy(t, p)
		br := bufio.NewReader(c)
		if _, err := io.WriteString(c, streamRequest("")+streamRequest("")+streamRequest("")); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			readStream(t, br, 3)
		}
	})
}

// A client that asks for its connection to close gets Connection: close on
// the stream's head, and the connection closes after the stream.
func TestRelayedStreamClosesWhenAsked(t *testing.T) {
	a := startReplica(t, "a", sse(2, nil))
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, streamRequest("Connection: close\r\n")); err != nil {
		t.Fatal(err)
	}
	resp := readStream(t, br, 2)
	if !resp.Close {
		t.Fatalf("head without Connection: close: %v", resp.Header)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the stream: %q, %v; want the connection closed", b, err)
	}
}

// The server's Shutdown does not wait for a relayed stream, whose
// connection it handed over: StreamsDone does, and after StopStreams the
// connection closes when its stream ends instead of serving again.
func TestStreamsDoneWaitsForRelayedStreams(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	a := startReplica(t, "a", sse(2, func(i int) {
		if i == 1 {
			close(started)
			<-release
		}
	}))
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, streamRequest("")); err != nil {
		t.Fatal(err)
	}
	<-started
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.h.StopStreams()
	if err := p.srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.h.StreamsDone(expired); err == nil {
		t.Fatal("StreamsDone returned nil with a stream still relayed")
	}
	close(release)
	got, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Fatalf("stream body %q, %v", got, err)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the stream: %q, %v; want the connection closed", b, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.h.StreamsDone(ctx); err != nil {
		t.Fatalf("StreamsDone after the stream ended: %v", err)
	}
}
