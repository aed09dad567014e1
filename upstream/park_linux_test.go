package upstream

import (
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warmroute/warmroute/rawsock"
)

// A replica's bytes past an urgent (MSG_OOB) byte: a read stops at the
// urgent mark, filling less than its buffer with bytes still queued, so
// that Poll skips the read that would find them; the poller, which the
// urgent byte's edge told (EPOLLPRI), has Park return false for them.
// (Found by review: with the end of stream alone kept, the wait stayed
// parked with "def" in the socket.)
func TestParkAfterUrgentByteReads(t *testing.T) {
	p, err := rawsock.NewPoller(50 * time.Millisecond)
	if err != nil {
		t.Skip("no poller here:", err)
	}
	r := startTestReplica(t, Config{FirstByteTimeout: time.Minute, StreamIdleTimeout: time.Minute})
	// Whether the wait parks for nothing depends on when the poller
	// collects the segment's two wakeups (the urgent mark's, the bytes'),
	// so the case runs on several connections.
	for range 5 {
		urgentByteReads(t, p, r)
	}
}

func urgentByteReads(t *testing.T, p *rawsock.Poller, r *testReplica) {
	t.Helper()
	c, end := r.connect(t)
	w := make(wakes, 1)
	start := time.Now()
	if ready, _ := c.Poll(nil, PhaseStream, start, false); ready {
		t.Fatal("ready before anything was sent")
	}
	if parked, err := c.Park(p, w, PhaseStream, start); !parked || err != nil {
		t.Fatalf("not parked: %v", err)
	}
	// One segment: "abc", the urgent "X", "def".
	src, _ := end.(*net.TCPConn).SyscallConn()
	src.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, 1)
		syscall.Write(int(fd), []byte("abc"))
		syscall.Sendto(int(fd), []byte("X"), syscall.MSG_OOB, nil)
		syscall.Write(int(fd), []byte("def"))
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, 0)
	})
	due := <-w
	var got []byte
	for len(got) < len("abcdef") {
		if ready, err := c.Poll(nil, PhaseStream, start, due); ready {
			if err != nil {
				t.Fatal(err)
			}
			b, _ := c.Reader.Peek(c.Buffered())
			got = append(got, b...)
			c.Reader.Discard(len(b))
			continue
		}
		parked, err := c.Park(p, w, PhaseStream, start)
		if err != nil {
			t.Fatal(err)
		}
		if !parked {
			continue
		}
		select {
		case due = <-w:
		case <-time.After(5 * time.Second):
			t.Fatalf("parked 5 s with no wake, %q read of %q", got, "abcdef")
		}
	}
	if string(got) != "abcdef" {
		t.Fatalf("read %q, want %q (the urgent byte is not inline)", got, "abcdef")
	}
}
