package upstream

import (
	"errors"
	"io"
	"net"
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
