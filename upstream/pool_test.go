package upstream

import (
	"net"
	"testing"
	"time"
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
	c1, err := r.Acquire(t0)
	if err != nil {
		t.Fatal(err)
	}
	c1.Release(t0)
	c2, err := r.Acquire(t0.Add(900 * time.Millisecond))
	if err != nil || c2 != c1 || !c2.Reused {
		t.Fatalf("a connection idle for 900ms was not reused: %v", err)
	}
	c2.Release(t0.Add(900 * time.Millisecond))
	c3, err := r.Acquire(t0.Add(1900 * time.Millisecond))
	if err != nil || c3 == c2 || c3.Reused {
		t.Fatalf("a connection idle for a second was reused: %v", err)
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
