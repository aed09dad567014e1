package router

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// scriptedReplica serves each connection with serve, after answering the
// proxy's own probes; serve gets the connection, its reader and the
// request, its body unread, and reports whether to read the next one.
func scriptedReplica(t testing.TB, serve func(c net.Conn, br *bufio.Reader, req *http.Request) bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.Header.Get("User-Agent") == upstream.ProbeUserAgent {
						io.Copy(io.Discard, req.Body)
						if _, err := c.Write(rawProbeAnswer(req)); err != nil {
							return
						}
						continue
					}
					if !serve(c, br, req) {
						return
					}
				}
			}(c)
		}
	}()
	return "http://" + ln.Addr().String()
}

// jsonAnswer is a whole 200 answer with body.
func jsonAnswer(body string) string {
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// within fails the test if ch is not closed within d.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("no %s within %v", what, d)
	}
}
