package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
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

// A Prepare method gives the reads after it their deadline, counted from
// the first read that has to wait: bytes buffered whole move no deadline,
// a replica that stalls is cut after the prepared time, and a wait that
// follows sets its own deadline, not the prepared one.
func TestPreparedReadDeadlines(t *testing.T) {
	const idle, first = 300 * time.Millisecond, 900 * time.Millisecond
	r := startTestReplica(t, Config{StreamIdleTimeout: idle, FirstByteTimeout: first})
	for _, tc := range []struct {
		name    string
		prepare func(*Conn)
		want    time.Duration
	}{
		{"head", (*Conn).PrepareHead, idle},
		{"body", (*Conn).PrepareBody, idle},
		{"line", (*Conn).PrepareLine, idle},
		{"whole", (*Conn).PrepareWhole, first},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv := r.connect(t)
			srv.Write([]byte("HTTP/1.1 200 OK\r\n"))
			if err := c.AwaitFirst(nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			untilBuffered(t, c, 17)
			before := c.readDeadline
			tc.prepare(c)
			if _, err := c.Reader.ReadSlice('\n'); err != nil {
				t.Fatal(err)
			}
			if !c.readDeadline.Equal(before) {
				t.Fatal("a line buffered whole moved the read deadline")
			}
			tc.prepare(c)
			srv.Write([]byte("Content-"))
			start := time.Now()
			_, err := c.Reader.ReadSlice('\n') // the rest of the line never comes
			d := time.Since(start)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("a stalled line: %v, want a timeout", err)
			}
			if d < tc.want-10*time.Millisecond || d > tc.want+5*time.Second {
				t.Fatalf("cut after %v, want about %v", d, tc.want)
			}
		})
	}
	// A wait after a Prepare whose read never came keeps the wait's own
	// deadline, not the prepared one.
	c, _ := startTestReplica(t, Config{StreamIdleTimeout: time.Minute, FirstByteTimeout: idle}).connect(t)
	c.PrepareHead()
	start := time.Now()
	if err := c.AwaitFirst(nil, start); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a wait after a prepare: %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > idle+5*time.Second {
		t.Fatalf("the wait took %v: the prepared deadline (a minute) replaced its own (%v)", d, idle)
	}
}

// untilBuffered reads c until n bytes are buffered.
func untilBuffered(t *testing.T, c *Conn, n int) {
	t.Helper()
	if _, err := c.Reader.Peek(n); err != nil {
		t.Fatal(err)
	}
}

// A wait's poll keeps the deadline that an earlier wait set while it is at
// least half a poll interval away and no later than this poll's wake, and
// moves it otherwise, to a poll interval away or the wait's end.
func TestArmPoll(t *testing.T) {
	now := time.Now()
	const never = time.Duration(-1)
	for _, tc := range []struct {
		name string
		set  time.Duration // the deadline already set, from now; never: none
		left time.Duration
		want time.Duration // the deadline after, from now
	}{
		{"none set", never, time.Minute, pollInterval},
		{"kept", pollInterval * 3 / 4, time.Minute, pollInterval * 3 / 4},
		{"kept at the wake", pollInterval, time.Minute, pollInterval},
		{"too close", pollInterval / 4, time.Minute, pollInterval},
		{"past", -time.Second, time.Minute, pollInterval},
		{"later than the wake", 2 * pollInterval, time.Minute, pollInterval},
		{"later than the wait's end", pollInterval * 3 / 4, pollInterval / 2, pollInterval / 2},
		{"the wait's end passed", pollInterval * 3 / 4, -time.Second, -time.Second},
	} {
		c := &Conn{nc: nopDeadlines{}}
		if tc.set != never {
			c.readDeadline = now.Add(tc.set)
		}
		c.src.due = time.Minute
		c.armPoll(now, tc.left)
		if got := c.readDeadline.Sub(now); got != tc.want {
			t.Errorf("%s: deadline %v from now, want %v", tc.name, got, tc.want)
		}
		if c.src.due != 0 {
			t.Errorf("%s: a prepared deadline survived the wait", tc.name)
		}
	}
}

// nopDeadlines is a net.Conn whose deadlines go nowhere.
type nopDeadlines struct{ net.Conn }

func (nopDeadlines) SetReadDeadline(time.Time) error { return nil }

// A relayed wait (AwaitFirstParked) gives its read buffer back from its
// first poll, where AwaitFirst keeps it for its first poll interval: a
// burst of thousands of relayed waits holds no buffer each. The wait
// still reads the answer whole, and still times out.
func TestAwaitFirstParkedHoldsNoBuffer(t *testing.T) {
	parked := make(chan struct{}, 16)
	// Not blocking: a wait of another test left parked must not hang
	// this one (none runs in parallel here).
	parkHook = func() {
		select {
		case parked <- struct{}{}:
		default:
		}
	}
	defer func() { parkHook = nil }()

	// A FirstByteTimeout under one poll interval: AwaitFirst's one poll
	// reads at once and never parks.
	r := startTestReplica(t, Config{FirstByteTimeout: 50 * time.Millisecond})
	c, _ := r.connect(t)
	if c.waitFn == nil {
		t.Skip("no parked wait on " + runtime.GOOS)
	}
	if err := c.AwaitFirst(nil, time.Now()); !errors.Is(err, ErrTimeout) {
		t.Fatalf("AwaitFirst of a silent replica: %v, want ErrTimeout", err)
	}
	if n := len(parked); n != 0 {
		t.Fatalf("AwaitFirst parked %d times within its first poll, want 0", n)
	}
	c2, _ := r.connect(t)
	if err := c2.AwaitFirstParked(nil, time.Now()); !errors.Is(err, ErrTimeout) {
		t.Fatalf("AwaitFirstParked of a silent replica: %v, want ErrTimeout", err)
	}
	if n := len(parked); n == 0 {
		t.Fatal("AwaitFirstParked never parked")
	}
	for len(parked) > 0 {
		<-parked
	}

	// An answer written once the wait parked is read whole.
	c3, srv := startTestReplica(t, Config{FirstByteTimeout: 10 * time.Second}).connect(t)
	answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	done := make(chan error, 1)
	go func() { done <- c3.AwaitFirstParked(nil, time.Now()) }()
	<-parked
	if _, err := srv.Write([]byte(answer)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(answer))
	if _, err := io.ReadFull(c3.Reader, got); err != nil || string(got) != answer {
		t.Fatalf("read %q, %v; want %q", got, err, answer)
	}
}
