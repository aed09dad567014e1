package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rawPost is a raw HTTP/1.1 POST of a JSON body to path.
func rawPost(path, body string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// A JSON answer with neither a length nor chunking, which its replica
// closed partway through, reaches the client as a 502, never as a 200
// holding half a JSON value, and the replica is demoted; a whole one, a
// string with brackets and escaped quotes in it included, is passed on.
func TestCutJSONAnswerIsA502(t *testing.T) {
	for _, tt := range []struct {
		body   string
		status int
	}{
		{`{"id":"x","choi`, 502},
		{`{"id":"x","choices":[{"text":"a \"}\" b`, 502},
		{``, 502},
		{`{"id":"x","choices":[{"text":"a \"}]\\\\"}]}`, 200},
		{"[1,2,{\"a\":[]}]\n", 200},
	} {
		url := rawReplica(t, false, func() []byte {
			return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + tt.body)
		})
		p := startProxy(t, RoundRobin, []string{url})
		c := dialProxy(t, p)
		io.WriteString(c, rawChat(chat(1, 1), ""))
		resp, got := readAnswer(t, bufio.NewReader(c), "POST")
		if resp.StatusCode != tt.status || tt.status == 200 && got != tt.body {
			t.Errorf("%q: %d %q, want %d", tt.body, resp.StatusCode, got, tt.status)
		}
		r := p.set.Replicas()[0]
		if demoted := tt.status == 502; demoted != (r.Demotions() == 1) {
			t.Errorf("%q: %d demotions of the replica", tt.body, r.Demotions())
		}
		if tt.status == 502 && !strings.HasPrefix(got, `{"error":`) {
			t.Errorf("%q: the 502 is not a JSON error: %s", tt.body, got)
		}
	}
}

// An SSE stream with neither a length nor chunking that ends, by its
// replica's close, before its API's last event is cut for the client, so
// that the client sees an error, and counted as a mid-stream failure; one
// that sent its last event ends cleanly.
func TestStreamEndedByCloseBeforeLastEventIsCut(t *testing.T) {
	for _, tt := range []struct {
		path, stream string
		whole        bool
	}{
		{"/v1/chat/completions", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", false},
		{"/v1/chat/completions", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", true},
		{"/v1/completions", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", false},
		{"/v1/messages", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: content_block_delta\ndata: {}\n\n", false},
		{"/v1/messages", "event: message_start\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", true},
		{"/v1/messages", "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n", true},
		{"/v1/responses", "event: response.created\ndata: {\"type\":\"response.created\"}\n\n", false},
		{"/v1/responses", "event: response.created\ndata: {}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\"}\n\n", true},
	} {
		url := rawReplica(t, false, func() []byte {
			return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + tt.stream)
		})
		p := startProxy(t, RoundRobin, []string{url})
		c := dialProxy(t, p)
		io.WriteString(c, rawPost(tt.path, chat(1, 1)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if tt.whole != (err == nil) || string(got) != tt.stream {
			t.Errorf("%s %q: the client read %q, %v", tt.path, tt.stream, got, err)
		}
		result := "ok"
		if !tt.whole {
			result = "mid_stream"
		}
		if n := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="`+result+`"}`); n != "1" {
			t.Errorf("%s %q: %s sends %q, want 1", tt.path, tt.stream, result, n)
		}
	}
}

// An HTTP/1.0 client cannot read chunks: a chunked answer reaches it whole,
// framed by its length or by the end of the connection, never chunked.
func TestHTTP10ClientGetsNoChunks(t *testing.T) {
	url := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n6\r\ndata: \r\n3\r\nok\n\r\n0\r\nX-Sum: 1\r\n\r\n")
	})
	p := startProxy(t, Adaptive, []string{url})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := chat(1, 1)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	got := string(raw)
	if strings.Contains(strings.ToLower(got), "transfer-encoding") || !strings.HasSuffix(got, "\r\n\r\ndata: ok\n") {
		t.Fatalf("HTTP/1.0 answer:\n%s", got)
	}
}

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

var sinkBool bool

// The completeness check of a JSON answer read whole, on a 1 MiB chat
// completion, beside encoding/json's Valid on the same bytes (a full
// validation) as the baseline; the check allocates nothing.
func BenchmarkJSONWhole(b *testing.B) {
	var body []byte
	body = append(body, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	for len(body) < 1<<20-200 {
		body = append(body, `Lorem ipsum dolor sit amet, \"quoted\" {braces} [brackets]\n `...)
	}
	body = append(body, `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":262144}}`...)
	b.Run("jsonWhole", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			sinkBool = jsonWhole(body)
		}
		if !sinkBool {
			b.Fatal("a whole answer read as cut")
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			sinkBool = json.Valid(body)
		}
		if !sinkBool {
			b.Fatal("the benchmark's answer is not valid JSON")
		}
	})
}
