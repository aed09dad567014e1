package router

import (
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"

	"github.com/warmroute/warmroute/rawsock"
	"github.com/warmroute/warmroute/upstream"
)

// acceptedPair returns a client connection as Listener hands it to
// fasthttp (rawsock under coarse deadlines) and the client's own end.
func acceptedPair(t *testing.T) (net.Conn, *net.TCPConn) {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	dialed := make(chan net.Conn, 1)
	go func() {
		c, err := net.Dial("tcp", tcp.Addr().String())
		if err != nil {
			t.Error(err)
		}
		dialed <- c
	}()
	c, err := ServerConfig{}.Listener(tcp).Accept()
	if err != nil {
		t.Fatal(err)
	}
	client := <-dialed
	if client == nil {
		t.FailNow()
	}
	t.Cleanup(func() { c.Close(); client.Close() })
	return c, client.(*net.TCPConn)
}

// untilReadable returns once the server's end of c has something to
// read (the client's bytes, its FIN or its reset), without reading it.
func untilReadable(t *testing.T, c net.Conn) {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		_, err := rawsock.Peek(fd, &b)
		return err != syscall.EAGAIN
	}); err != nil {
		t.Fatal(err)
	}
}

// A wait polls its client with upstream.PeerClosed: a client that left,
// with a FIN or a reset, is found; one that is there, idle or with a
// pipelined request sent, is not, and its bytes stay to be read. The
// connection as fasthttp has it, the pipelined one a relay makes of it,
// and a bare TCP connection (upstream's allocating path) agree.
func TestPeerClosed(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the proxy peeks at its client's socket on Linux only")
	}
	wrappers := []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{
		{"accepted", func(c net.Conn) net.Conn { return c }},
		{"pipelined", func(c net.Conn) net.Conn { return &pipelinedConn{Conn: c} }},
		{"bare TCP", func(c net.Conn) net.Conn { return c.(*coarseSocket).Conn.(*rawsock.Conn).TCPConn }},
	}
	states := []struct {
		name   string
		do     func(client *net.TCPConn)
		closed bool
	}{
		{"idle", nil, false},
		{"a byte sent", func(c *net.TCPConn) { c.Write([]byte("x")) }, false},
		{"closed", func(c *net.TCPConn) { c.Close() }, true},
		{"reset", func(c *net.TCPConn) { c.SetLinger(0); c.Close() }, true},
	}
	for _, w := range wrappers {
		for _, s := range states {
			t.Run(w.name+"/"+s.name, func(t *testing.T) {
				c, client := acceptedPair(t)
				if s.do != nil {
					s.do(client)
					untilReadable(t, c)
				}
				if got := upstream.PeerClosed(w.wrap(c)); got != s.closed {
					t.Fatalf("PeerClosed = %v, want %v", got, s.closed)
				}
				if s.name == "a byte sent" {
					buf := make([]byte, 4)
					if n, err := io.ReadAtLeast(c, buf, 1); err != nil || string(buf[:n]) != "x" {
						t.Fatalf("read after PeerClosed = %q, %v; want the byte", buf[:n], err)
					}
				}
			})
		}
	}
	t.Run("server end closed", func(t *testing.T) {
		c, _ := acceptedPair(t)
		c.Close()
		if !upstream.PeerClosed(c) {
			t.Fatal("PeerClosed of a closed connection = false")
		}
	})
}
