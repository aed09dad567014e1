package upstream

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A pooled connection is reused while it is younger than IdleTimeout and
// closed, never used, once it is older: the replica's own keep-alive timeout
// must not close it under a request. The clock is the caller's, so the test
// moves it by hand.
func TestPoolExpiresIdleConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	s, err := NewSet([]string{ln.Addr().String()}, Config{IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Replica(0)
	t0 := time.Now()
	c1, e := r.Acquire(t0)
	if e != nil {
		t.Fatal(e)
	}
	c1.Release(t0)
	c2, e := r.Acquire(t0.Add(900 * time.Millisecond))
	if e != nil || c2 != c1 || !c2.Reused {
		t.Fatalf("a connection idle for 900ms was not reused: %v", e)
	}
	c2.Release(t0.Add(900 * time.Millisecond))
	c3, e := r.Acquire(t0.Add(1900 * time.Millisecond))
	if e != nil || c3 == c2 || c3.Reused {
		t.Fatalf("a connection idle for a second was reused: %v", e)
	}
	c3.Release(t0.Add(2 * time.Second))
	r.closeExpired(t0.Add(2*time.Second + 999*time.Millisecond))
	if len(r.idle) != 1 {
		t.Fatalf("%d idle connections, want 1: it is not expired yet", len(r.idle))
	}
	r.closeExpired(t0.Add(3 * time.Second))
	if len(r.idle) != 0 {
		t.Fatalf("%d idle connections after they expired, want 0", len(r.idle))
	}
}

// Release pools a connection only when its next request can use it: not
// one marked broken, one with bytes of an answer unread, one to a replica
// that is down, or one past MaxIdleConns. Acquire takes the last one
// pooled, marked Reused.
func TestReleasePoolsOnlyUsableConnections(t *testing.T) {
	for _, tt := range []struct {
		name   string
		spoil  func(c *Conn, srv net.Conn, r *testReplica)
		pooled bool
	}{
		{"clean", nil, true},
		{"after an answer", func(c *Conn, srv net.Conn, _ *testReplica) {
			serve(srv, 0, "HTTP/1.1 204 No Content\r\n\r\n")
			var hd fasthttp.ResponseHeader
			head, _ := request(0)
			if err := c.RoundTrip(head, nil, &hd, nil, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"broken", func(c *Conn, _ net.Conn, _ *testReplica) { c.MarkBroken() }, false},
		{"answer unread", func(c *Conn, srv net.Conn, _ *testReplica) {
			serve(srv, 0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
			var hd fasthttp.ResponseHeader
			head, _ := request(0)
			if err := c.RoundTrip(head, nil, &hd, nil, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			srv.Write([]byte("ok"))
			if _, err := c.br.Peek(2); err != nil { // the body's bytes in the buffer, unread
				t.Fatal(err)
			}
		}, false},
		{"replica down", func(_ *Conn, _ net.Conn, r *testReplica) { r.Demote(errors.New("down"), time.Now()) }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := startTestReplica(t, Config{})
			c, srv := r.connect(t)
			if tt.spoil != nil {
				tt.spoil(c, srv, r)
			}
			c.Release(time.Now())
			if pooled := len(r.idle) == 1; pooled != tt.pooled {
				t.Fatalf("pooled %v, want %v", pooled, tt.pooled)
			}
			if !tt.pooled {
				srv.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := srv.Read(make([]byte, 1)); err != io.EOF {
					t.Fatalf("a connection not pooled was not closed: %v", err)
				}
				return
			}
			if c.br != nil {
				t.Fatal("a pooled connection holds its read buffer")
			}
			if again, _ := r.connect(t); again != c || !again.Reused {
				t.Fatal("Acquire did not take the pooled connection")
			}
		})
	}
	r := startTestReplica(t, Config{MaxIdleConns: 1})
	a, _ := r.connect(t)
	b, _ := r.connect(t)
	a.Release(time.Now())
	b.Release(time.Now())
	if len(r.idle) != 1 || r.idle[0] != a {
		t.Fatalf("%d pooled past MaxIdleConns 1", len(r.idle))
	}
}
