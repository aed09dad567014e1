package router

import (
	"bufio"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A replica's head that cannot be read as HTTP, or whose framing is
// ambiguous, is a 502: the replica may have run the request, so it is not
// sent again; the connection to the replica is not reused (the replica
// keeps it open and would frame the next answer after the bad one); and
// the client's connection serves its next, pipelined, request. So is an
// interim answer that its replica does not follow with a whole final one.
func TestMalformedHeadIsABadGateway(t *testing.T) {
	big := strings.Repeat("a", 5000) // past the replica connection's 4 KiB read buffer
	for _, tt := range []struct {
		name, answer string
		closes       bool // the replica closes its connection after the answer
	}{
		{"head over 4 KiB", "HTTP/1.1 200 OK\r\nX-Big: " + big + "\r\nContent-Length: 2\r\n\r\n{}", false},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}", false},
		{"length past int64", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n{}", false},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\n{}", false},
		{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", false},
		{"a coding other than chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n{}", false},
		{"status not a number", "HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\n{}", false},
		{"a line without a colon", "HTTP/1.1 200 OK\r\nBogus\r\nContent-Length: 2\r\n\r\n{}", false},
		{"not HTTP", "SSH-2.0-OpenSSH_9.6\r\n\r\n", false},
		{"100 Continue, then the end", "HTTP/1.1 100 Continue\r\n\r\n", true},
		{"102 Processing, then half a head", "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\nContent-Le", true},
		{"101 Switching Protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int64
			url := rawReplica(t, !tt.closes, func() []byte {
				if n.Add(1) == 1 {
					return []byte(tt.answer)
				}
				return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			})
			p := startProxy(t, RoundRobin, []string{url})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			start := time.Now()
			io.WriteString(c, rawChat(chat(1, 1), "")+rawChat(chat(2, 1), ""))
			resp, got := readAnswer(t, br, "POST")
			if resp.StatusCode != 502 || !strings.Contains(got, `"upstream_error"`) || resp.Close {
				t.Fatalf("%d %q (close %v), want a 502 upstream_error, the connection kept", resp.StatusCode, got, resp.Close)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the 502 took %v: the proxy waited for bytes that were never due", d)
			}
			if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
				t.Fatalf("the next request: %d %q", resp.StatusCode, got)
			}
			if got := n.Load(); got != 2 {
				t.Fatalf("the replica had %d requests, want 2: the first was sent again", got)
			}
			settled(t, p)
		})
	}
}
