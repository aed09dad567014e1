package upstream

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/rawsock"
)

// wakes is a rawsock.Waiter whose wakes are sent on a channel.
type wakes chan bool

func (w wakes) Due() bool     { return false }
func (w wakes) Wake(due bool) { w <- due }

// pollWait is AwaitFirst made of Poll and Park on p, as a relay makes it.
func pollWait(t *testing.T, p *rawsock.Poller, c *Conn, start time.Time) error {
	t.Helper()
	w, due := make(wakes, 1), false
	for {
		if ready, err := c.Poll(nil, PhaseAwait, start, due); ready {
			return err
		}
		parked, err := c.Park(p, w, PhaseAwait, start)
		if err != nil {
			t.Fatal(err)
		}
		if parked {
			select {
			case due = <-w:
			case <-time.After(10 * time.Second):
				t.Fatal("no wake within 10 s")
			}
		}
	}
}

// A wait made of Poll and Park (a relay's, parked on the poller) judges
// each way a replica answers as AwaitFirstParked does: bytes, an end of
// stream after the replica read the request, a reset, nothing within the
// first-byte timeout. Each connection carries the read deadline that an
// earlier wait left, long passed, as one that sat in the pool does.
func TestPollJudgesAsAwait(t *testing.T) {
	p, err := rawsock.NewPoller(50 * time.Millisecond)
	if err != nil {
		t.Skip("no poller here:", err)
	}
	r := startTestReplica(t, Config{FirstByteTimeout: 300 * time.Millisecond, StreamIdleTimeout: time.Second})
	req := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	for _, tc := range []struct {
		name    string
		replica func(srv *net.TCPConn)
		want    Sign // for an error; answer for none
		answer  bool
	}{
		{"answer", func(srv *net.TCPConn) {
			io.ReadFull(srv, make([]byte, len(req)))
			srv.Write([]byte("HTTP/1.1 200 OK\r\n\r\n"))
		}, 0, true},
		{"end after reading", func(srv *net.TCPConn) { io.ReadFull(srv, make([]byte, len(req))); srv.Close() }, SignFailed, false},
		{"reset", func(srv *net.TCPConn) { srv.SetLinger(0); srv.Close() }, SignReset, false},
		{"nothing", func(*net.TCPConn) {}, SignTimeout, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, parked := range []bool{false, true} {
				c, end := r.connect(t)
				c.setReadDeadline(time.Now().Add(-time.Minute))
				if err := c.Write(req, nil); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				tc.replica(end.(*net.TCPConn))
				var err error
				if parked {
					err = pollWait(t, p, c, start)
				} else {
					err = c.AwaitFirstParked(nil, start)
				}
				var e *Error
				switch {
				case tc.answer && err != nil:
					t.Fatalf("parked %v: %v, want the answer", parked, err)
				case tc.answer:
					if b, _ := c.Reader.Peek(4); string(b) != "HTTP" {
						t.Fatalf("parked %v: buffered %q, want the answer", parked, b)
					}
				case !errors.As(err, &e) || e.Sign != tc.want:
					t.Fatalf("parked %v: %v, want an error of sign %v", parked, err, tc.want)
				}
			}
		})
	}
}

// A wait that follows a read which emptied the socket parks without
// reading (the read would find nothing): Poll returns false even for a byte
// already queued, and the poller hands that byte on, as a Park that
// returns false or as a wake that is not the deadline's. Only the first
// Poll after such a read skips its read.
func TestPollAfterDrainingReadsNothing(t *testing.T) {
	p, err := rawsock.NewPoller(50 * time.Millisecond)
	if err != nil {
		t.Skip("no poller here:", err)
	}
	r := startTestReplica(t, Config{FirstByteTimeout: time.Minute, StreamIdleTimeout: time.Minute})
	c, end := r.connect(t)
	w := make(wakes, 1)
	// next waits, parked, for the next byte that end sends.
	next := func(b byte) {
		t.Helper()
		start := time.Now()
		for polls := 0; ; polls++ {
			if ready, err := c.Poll(nil, PhaseStream, start, false); ready {
				if err != nil {
					t.Fatal(err)
				}
				if got, _ := c.Reader.ReadByte(); got != b {
					t.Fatalf("read %q, want %q", got, b)
				}
				return
			}
			if polls > 2 {
				t.Fatalf("%d polls for %q: a skipped read was not made up", polls, b)
			}
			parked, err := c.Park(p, w, PhaseStream, start)
			if err != nil {
				t.Fatal(err)
			}
			if !parked {
				continue
			}
			select {
			case due := <-w:
				if due {
					t.Fatalf("woken as due, not for %q", b)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no wake for %q within 5 s", b)
			}
		}
	}
	go end.Write([]byte("a"))
	next('a')
	if !c.src.drained {
		t.Fatal("a read of 1 byte into a 4 KiB buffer did not count as emptying the socket")
	}
	end.Write([]byte("b"))
	var one [1]byte
	giveUp := time.Now().Add(10 * time.Second)
	for queued := false; !queued; {
		c.rc.Control(func(fd uintptr) {
			n, _ := rawsock.Peek(fd, &one)
			queued = n == 1
		})
		if time.Now().After(giveUp) {
			t.Fatal("the byte never reached the socket")
		}
	}
	start := time.Now()
	if ready, _ := c.Poll(nil, PhaseStream, start, false); ready {
		t.Fatal("Poll read after a read that emptied the socket")
	}
	parked, err := c.Park(p, w, PhaseStream, start)
	if err != nil {
		t.Fatal(err)
	}
	if parked {
		select {
		case due := <-w:
			if due {
				t.Fatal("woken as due, not for the queued byte")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no wake for the queued byte within 5 s")
		}
	}
	next('b') // its Poll reads
	go end.Write([]byte("c"))
	next('c')
	// The socket leaves the poller, as its connection goes back to the
	// pool, and a byte comes before it is registered again: the
	// registration finds it.
	c.leavePoller()
	end.Write([]byte("d"))
	next('d')

	// A read that fills the buffer proves nothing: the next Poll reads.
	big := make([]byte, 3*connReadBuffer)
	end.Write(big)
	for queued := 0; queued < len(big); {
		c.rc.Control(func(fd uintptr) {
			queued, _, _ = syscall.Recvfrom(int(fd), big, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		})
		if time.Now().After(giveUp) {
			t.Fatal("the bytes never reached the socket")
		}
	}
	next(0)
	c.Reader.Discard(c.Reader.Buffered())
	if ready, err := c.Poll(nil, PhaseStream, time.Now(), false); !ready || err != nil || c.Buffered() == 0 {
		t.Fatalf("Poll after a read that filled the buffer: %v %v, %d bytes, want the rest read", ready, err, c.Buffered())
	}
}
