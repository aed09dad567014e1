package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// AwaitMore waits without a read buffer (parkedPeek) and takes one back
// when bytes come: bytes that came before the wait are found at once,
// bytes that come across several poll intervals are found, all in order,
// and the wait ends with the stream's end or after StreamIdleTimeout as
// Peek's wait did.
func TestAwaitMoreParked(t *testing.T) {
	r := startTestReplica(t, Config{StreamIdleTimeout: 700 * time.Millisecond})
	c, srv := r.connect(t)

	// Bytes already in the socket before the wait.
	srv.Write([]byte("ab"))
	untilReadable(t, c)
	if err := c.AwaitMore(nil, PhaseStream); err != nil {
		t.Fatalf("bytes already sent: %v", err)
	}
	if b, _ := c.Reader.Peek(c.Reader.Buffered()); string(b) != "ab" {
		t.Fatalf("buffered %q, want %q", b, "ab")
	}
	c.Reader.Discard(2)

	// A body in pieces, some after more than a poll interval.
	var want bytes.Buffer
	for i := 0; i < 3000; i++ {
		want.WriteByte(byte('a' + i%26))
	}
	go func() {
		b := want.Bytes()
		for i, n := 0, 0; n < len(b); i++ {
			k := min(len(b)-n, 1+i*97%1500)
			srv.Write(b[n : n+k])
			n += k
			pause := time.Millisecond
			if i%7 == 3 {
				pause = 300 * time.Millisecond
			}
			time.Sleep(pause)
		}
	}()
	var got []byte
	buf := make([]byte, 512)
	for len(got) < want.Len() {
		if err := c.AwaitMore(nil, PhaseStream); err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		n, _ := c.Reader.Read(buf)
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("relayed %d bytes that differ from the %d sent", len(got), want.Len())
	}

	// Nothing for StreamIdleTimeout.
	start := time.Now()
	err := c.AwaitMore(nil, PhaseStream)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("a silent replica: %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d < 600*time.Millisecond || d > 10*time.Second {
		t.Fatalf("timed out after %v, want about 700ms", d)
	}
	if c.Reader == nil {
		t.Fatal("no read buffer after a failed wait")
	}

	// The replica's end.
	c2, srv2 := r.connect(t)
	go func() {
		time.Sleep(100 * time.Millisecond)
		srv2.Write([]byte("z"))
		srv2.Close()
	}()
	if err := c2.AwaitMore(nil, PhaseStream); err != nil {
		t.Fatalf("a last byte: %v", err)
	}
	c2.Reader.Discard(1)
	if err := c2.AwaitMore(nil, PhaseStream); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("the replica closed: %v, want io.ErrUnexpectedEOF", err)
	}
}

// A wait for an answer reads at once on its first poll interval and waits
// without a read buffer after it (a long prefill): an answer that comes
// after several intervals is read whole, in order.
func TestAwaitFirstParksAfterAPollInterval(t *testing.T) {
	// An answer lost by the wait fails in 10 s, not at the test's timeout.
	c, srv := startTestReplica(t, Config{FirstByteTimeout: 10 * time.Second}).connect(t)
	answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	// Past two poll intervals: the wait is parked by then.
	timer := time.AfterFunc(2*pollInterval+pollInterval/2, func() { srv.Write([]byte(answer)) })
	defer timer.Stop()
	if err := c.AwaitFirst(nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(answer))
	if _, err := io.ReadFull(c.Reader, got); err != nil || string(got) != answer {
		t.Fatalf("read %q, %v; want %q", got, err, answer)
	}
}

// testReplica is a loopback listener that stands for a replica, with a set
// in front of it.
type testReplica struct {
	*Replica
	accepted chan net.Conn
}

func startTestReplica(t *testing.T, cfg Config) *testReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startTestReplicaOn(t, ln, cfg)
}

// startTestReplicaOn is startTestReplica on a listener of the test's.
func startTestReplicaOn(t *testing.T, ln net.Listener, cfg Config) *testReplica {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	s, err := NewSet([]string{ln.Addr().String()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testReplica{s.Replica(0), accepted}
}

// connect returns a new connection to r, and the replica's end of it;
// both are closed when the test ends.
func (r *testReplica) connect(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	c, err := r.Acquire(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-r.accepted
	t.Cleanup(func() { c.Close(); srv.Close() })
	return c, srv
}
