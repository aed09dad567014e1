package router

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// An answer that its replica writes a byte at a time, each its own TCP
// segment, is read across as many reads: its head, a length-framed body,
// and a chunked stream's sizes, data, line ends and trailers, each split
// at every byte. The client gets the answer whole, and the connection to
// the replica serves the next request.
func TestAnswerTrickledByteByByte(t *testing.T) {
	for _, tt := range []struct{ name, answer, body, trailer string }{
		{"sized", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}", `{"ok":true}`, ""},
		{"chunked stream with a trailer", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n" +
			"9\r\ndata: a\n\n\r\ne;ext=1\r\ndata: [DONE]\n\n\r\n0\r\nX-Sum: 7\r\n\r\n", "data: a\n\ndata: [DONE]\n\n", "7"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int64
			url := scriptedReplica(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
				io.Copy(io.Discard, req.Body)
				if n.Add(1) > 1 {
					_, err := io.WriteString(c, jsonAnswer("{}"))
					return err == nil
				}
				for i := 0; i < len(tt.answer); i++ {
					if _, err := c.Write([]byte{tt.answer[i]}); err != nil {
						return false
					}
					time.Sleep(200 * time.Microsecond) // the replica's pace, not a synchronisation
				}
				return true
			})
			p := startProxy(t, Adaptive, []string{url})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			io.WriteString(c, rawChat(chat(1, 1), ""))
			resp, got := readAnswer(t, br, "POST")
			if resp.StatusCode != 200 || got != tt.body || resp.Trailer.Get("X-Sum") != tt.trailer {
				t.Fatalf("%d %q trailer %q, want 200 %q trailer %q", resp.StatusCode, got, resp.Trailer.Get("X-Sum"), tt.body, tt.trailer)
			}
			io.WriteString(c, rawChat(chat(2, 1), ""))
			if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
				t.Fatalf("the next request: %d %q", resp.StatusCode, got)
			}
			if n.Load() != 2 {
				t.Fatalf("the replica had %d requests, want 2", n.Load())
			}
			settled(t, p)
		})
	}
}

// A replica that trickles a stream a byte at a time, each byte well inside
// -stream-idle-timeout, is cut once it has sent less than -stream-min-rate
// for that long, and counted as a mid-stream failure.
func TestTrickledStreamIsCutBelowTheMinimumRate(t *testing.T) {
	url := trickler(t, 10*time.Millisecond) // 100 bytes a second
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.StreamIdleTimeout, u.StreamMinRate = 200*time.Millisecond, 1000
	})
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	readCut(t, c)
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="mid_stream"}`); got != "1" {
		t.Errorf("mid_stream sends = %q, want 1", got)
	}
	if !strings.Contains(p.logs.String(), upstream.ErrTooSlow.Error()) {
		t.Errorf("the cut's log line does not say that the replica was too slow")
	}
}

// -response-timeout bounds a whole stream, however steadily it flows, and
// the wait for an answer that never comes: a 504 long before
// -first-byte-timeout.
func TestResponseTimeoutBoundsTheWholeAnswer(t *testing.T) {
	url := trickler(t, time.Millisecond)
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.ResponseTimeout = 300 * time.Millisecond
	})
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	readCut(t, c)
	if !strings.Contains(p.logs.String(), upstream.ErrResponseTimeout.Error()) {
		t.Errorf("the cut's log line does not name the response timeout")
	}

	silent := startReplica(t, "silent", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	p = startProxy(t, Adaptive, []string{silent.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.ResponseTimeout = 300 * time.Millisecond // FirstByteTimeout is 10 s
	})
	c = dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	if resp, body := readAnswer(t, bufio.NewReader(c), "POST"); resp.StatusCode != 504 {
		t.Fatalf("%d %s, want 504", resp.StatusCode, body)
	}
}
