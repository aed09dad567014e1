package router

import (
	"bufio"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"github.com/warmroute/warmroute/upstream"
)

// recordingConn is a connection that reads and writes nothing and records
// the deadlines that reach it.
type recordingConn struct {
	net.Conn
	mu       sync.Mutex
	setCalls []string
}

func (c *recordingConn) Read(p []byte) (int, error)  { return len(p), nil }
func (c *recordingConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *recordingConn) record(dir string, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := dir + "0"
	if !t.IsZero() {
		s = dir + t.Sub(epoch).String()
	}
	c.setCalls = append(c.setCalls, s)
	return nil
}
func (c *recordingConn) SetReadDeadline(t time.Time) error  { return c.record("r", t) }
func (c *recordingConn) SetWriteDeadline(t time.Time) error { return c.record("w", t) }

// epoch is a fixed time far in the future, so that no deadline below is
// past and each is written as its offset from epoch.
// Both are wall-clock times only (Round(0)), as the deadlines that reach the
// connection are.
var epoch = time.Now().Add(time.Hour).Round(0)

func TestCoarseDeadlines(t *testing.T) {
	at := func(d time.Duration) time.Time { return epoch.Add(d) }
	type op struct {
		read, write bool      // Read or Write
		dir         byte      // or ask for a deadline in 'r' or 'w'
		t           time.Time // that deadline
	}
	ask := func(dir byte, t time.Time) op { return op{dir: dir, t: t} }
	rd, wr := op{read: true}, op{write: true}
	past := time.Now().Add(-time.Second).Round(0)
	tests := []struct {
		name string
		ops  []op
		want []string // deadlines reaching the connection, in order
	}{
		{"asked but never waited on: nothing", []op{ask('r', at(60*time.Second)), ask('w', at(time.Minute))}, nil},
		{"a read takes the read deadline, a write the write deadline",
			[]op{ask('r', at(time.Second)), ask('w', at(2*time.Second)), rd, wr},
			[]string{"r1s", "w2s"}},
		{"moved later by less than the slack: left",
			[]op{ask('r', at(0)), rd, ask('r', at(99*time.Millisecond)), rd, ask('w', at(0)), wr, ask('w', at(50*time.Millisecond)), wr},
			[]string{"r0s", "w0s"}},
		{"moved later by the slack or more: moved",
			[]op{ask('r', at(0)), rd, ask('r', at(100*time.Millisecond)), rd},
			[]string{"r0s", "r100ms"}},
		{"moved earlier by any amount: moved",
			[]op{ask('r', at(time.Second)), rd, ask('r', at(time.Second-time.Nanosecond)), rd},
			[]string{"r1s", "r999.999999ms"}},
		{"already past: at once, with no read to wait on it",
			[]op{ask('r', at(time.Second)), rd, ask('r', past), ask('w', past)},
			[]string{"r1s", "r" + past.Sub(epoch).String(), "w" + past.Sub(epoch).String()}},
		{"removed: removed",
			[]op{ask('w', at(time.Second)), wr, ask('w', time.Time{}), wr, wr},
			[]string{"w1s", "w0"}},
		{"fasthttp's keep-alive loop: idle 90s, request 60s, answer 60s, 1ms apart",
			func() (ops []op) {
				for i := range 50 {
					now := time.Duration(i) * time.Millisecond
					ops = append(ops, ask('r', at(now+90*time.Second)), rd, ask('r', at(now+60*time.Second)), ask('w', at(now+60*time.Second)), wr)
				}
				return ops
			}(),
			[]string{"r1m30s", "w1m0s"}},
		{"a request read in several pieces waits under its own deadline",
			[]op{ask('r', at(90*time.Second)), rd, ask('r', at(60*time.Second)), rd, rd},
			[]string{"r1m30s", "r1m0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := &recordingConn{}
			c := &coarseConn{Conn: rc, slack: int64(100 * time.Millisecond)}
			for _, o := range tt.ops {
				switch {
				case o.read:
					c.Read(make([]byte, 1))
				case o.write:
					c.Write([]byte("x"))
				case o.dir == 'r':
					c.SetReadDeadline(o.t)
				default:
					c.SetWriteDeadline(o.t)
				}
			}
			if got := strings.Join(rc.setCalls, " "); got != strings.Join(tt.want, " ") {
				t.Fatalf("deadlines set: %q, want %q", got, strings.Join(tt.want, " "))
			}
		})
	}
}

// A deadline already past interrupts a read that waits, at once: it is how
// a goroutine stops another's read.
func TestCoarseDeadlinePastInterruptsARead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cln := ServerConfig{ReadTimeout: time.Minute}.Listener(ln)
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := cln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	// The read may not have started to wait yet; the deadline interrupts it
	// either way, since it reaches the socket before this call returns.
	c.SetReadDeadline(time.Now())
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read ended with %v, want a deadline error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a past deadline did not interrupt the read")
	}
}

// countingListener counts the deadlines that reach its connections.
type countingListener struct {
	net.Listener
	mu    sync.Mutex
	calls int
}

type countingConn struct {
	net.Conn
	l *countingListener
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l}, nil
}

func (l *countingListener) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

func (c countingConn) SetReadDeadline(t time.Time) error {
	c.l.mu.Lock()
	c.l.calls++
	c.l.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c countingConn) SetWriteDeadline(t time.Time) error {
	c.l.mu.Lock()
	c.l.calls++
	c.l.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

// Behind fasthttp, with its three deadline moves a request, a keep-alive
// connection's deadlines reach the socket far less than once a request.
func TestCoarseDeadlinesBehindFasthttp(t *testing.T) {
	for _, coarse := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg := ServerConfig{ReadTimeout: time.Minute, IdleTimeout: 90 * time.Second}
		counted := &countingListener{Listener: ln}
		var served net.Listener = counted
		if coarse {
			served = cfg.Listener(counted)
		}
		srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") },
			ReadTimeout: cfg.ReadTimeout, IdleTimeout: cfg.IdleTimeout, WriteTimeout: cfg.writeTimeout()}
		go srv.Serve(served)
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		const n = 200
		for range n {
			if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			var resp fasthttp.Response
			if err := resp.Read(br); err != nil || string(resp.Body()) != "ok" {
				t.Fatalf("%v %q", err, resp.Body())
			}
		}
		c.Close()
		srv.Shutdown()
		got := counted.count()
		t.Logf("coarse=%v: %d deadlines set for %d requests", coarse, got, n)
		if coarse && got > n/4 {
			t.Errorf("%d deadlines reached the socket for %d requests", got, n)
		}
		if !coarse && got < 2*n {
			t.Errorf("without coarse deadlines, %d deadlines for %d requests: fasthttp no longer sets them per request, and this test measures nothing", got, n)
		}
	}
}

// A request that stalls in its head on a keep-alive connection is still cut
// at the read timeout, not at the far longer idle timeout that the
// connection's wait for it set.
func TestSlowRequestStillTimesOut(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.ReadTimeout, s.IdleTimeout = 300*time.Millisecond, 20*time.Second
	})
	c := rawRequest(t, p.addr, chat(1, 1))
	defer c.Close()
	br := bufio.NewReader(c)
	var resp fasthttp.Response
	if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("first request: %v %d", err, resp.StatusCode())
	}
	start := time.Now()
	if _, err := c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		var resp fasthttp.Response
		for {
			if err := resp.Read(br); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case <-ended:
		if d := time.Since(start); d < 250*time.Millisecond || d > 10*time.Second {
			t.Fatalf("the stalled request was cut after %v, want about the read timeout (300ms)", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a request stalled in its head was never cut")
	}
}

// A wrapped TCP connection keeps what the router needs of a socket (the
// liveness peek, the lingering close); a wrapped connection of another kind
// does not pretend to have it, so that its close does not linger.
func TestCoarseConnKeepsSocketMethods(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	mem := fasthttputil.NewInmemoryListener()
	defer mem.Close()
	for _, tt := range []struct {
		name   string
		ln     net.Listener
		dial   func() (net.Conn, error)
		socket bool
	}{
		{"tcp", tcp, func() (net.Conn, error) { return net.Dial("tcp", tcp.Addr().String()) }, true},
		{"in-memory", mem, mem.Dial, false},
	} {
		ln := ServerConfig{}.Listener(tt.ln)
		dialed := make(chan net.Conn, 1)
		go func() {
			c, err := tt.dial()
			if err != nil {
				t.Error(err)
			}
			dialed <- c
		}()
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if client := <-dialed; client != nil {
			defer client.Close()
		}
		_, sc := c.(syscall.Conn)
		_, cw := c.(interface{ CloseWrite() error })
		if sc != tt.socket || cw != tt.socket {
			t.Errorf("%s: SyscallConn %v, CloseWrite %v; want %v", tt.name, sc, cw, tt.socket)
		}
		if tt.socket && sc && cw {
			if err := c.(socket).CloseWrite(); err != nil {
				t.Errorf("%s: CloseWrite: %v", tt.name, err)
			}
		}
		c.Close()
	}
}
