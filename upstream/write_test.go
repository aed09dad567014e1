package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// connectSmallBuffers is connect with small socket buffers both ways, so
// that a large request fills them many times over.
func connectSmallBuffers(t *testing.T, cfg Config) (*Conn, *net.TCPConn) {
	t.Helper()
	c, srv := startTestReplica(t, cfg).connect(t)
	c.nc.(*net.TCPConn).SetWriteBuffer(32 << 10)
	srv.SetReadBuffer(32 << 10)
	return c, srv
}

// A request larger than the socket's buffers (an agent's long context),
// which its replica reads slowly, arrives whole and in order, and its
// answer is read.
func TestLargeRequestReadSlowly(t *testing.T) {
	c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: 5 * time.Second, FirstByteTimeout: 5 * time.Second})
	head, body := request(300 << 10)
	got := readSlowly(srv, len(head)+len(body), 8<<10)
	read := make(chan []byte, 1)
	go func() {
		b := <-got
		srv.Write([]byte("HTTP/1.1 204 No Content\r\n\r\n"))
		read <- b
	}()
	var hd fasthttp.ResponseHeader
	if err := roundTripWithin(t, c, len(body), &hd, nil, nil); err != nil || hd.StatusCode() != 204 {
		t.Fatalf("%v, status %d", err, hd.StatusCode())
	}
	if b := <-read; !bytes.Equal(b, append(head, body...)) {
		t.Fatalf("the replica read %d bytes that differ from the request's %d", len(b), len(head)+len(body))
	}
}

// A replica that fails in the middle of a large request: one that stops
// reading fails the write at StreamIdleTimeout, with an exact prefix of the
// request read, and one that resets or closes its connection fails it at
// once. The replica never had the whole request: another replica gets it.
func TestLargeRequestCut(t *testing.T) {
	for _, tt := range []struct {
		name string
		cut  func(srv *net.TCPConn)
		sign Sign
	}{
		{"stops reading", nil, SignTimeout},
		{"resets", func(srv *net.TCPConn) { srv.SetLinger(0); srv.Close() }, SignFailed},
		{"closes", func(srv *net.TCPConn) { srv.Close() }, SignFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			idle := 30 * time.Second
			if tt.cut == nil {
				idle = 300 * time.Millisecond
			}
			c, srv := connectSmallBuffers(t, Config{StreamIdleTimeout: idle})
			head, body := request(1 << 20)
			const part = 50 << 10
			first := readRequest(srv, part)
			read := make(chan []byte, 1)
			go func() {
				b := <-first
				if tt.cut != nil {
					tt.cut(srv)
				}
				read <- b
			}()
			start := time.Now()
			var hd fasthttp.ResponseHeader
			err := roundTripWithin(t, c, len(body), &hd, nil, nil)
			if err == nil || err.Phase != PhaseWrite || err.Sign != tt.sign {
				t.Fatalf("%v, want a %v in PhaseWrite", err, tt.sign)
			}
			if tt.cut != nil {
				if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
					t.Fatalf("%v, want ECONNRESET or EPIPE", err)
				}
				if d := time.Since(start); d > idle/2 {
					t.Fatalf("the failure was found after %v", d)
				}
			}
			if v := Judge(err, Attempt{Sends: 1, MaxSends: 2, Others: true}); v != (Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}) {
				t.Fatalf("judged %+v", v)
			}
			if tt.cut != nil {
				return
			}
			c.Close()
			rest, _ := io.ReadAll(srv)
			got := append(<-read, rest...)
			want := append(head, body...)
			if len(got) < part || len(got) >= len(want) || !bytes.Equal(got, want[:len(got)]) {
				t.Fatalf("the replica got %d bytes of a %d-byte request, not a proper prefix of it", len(got), len(want))
			}
		})
	}
}

// The write deadline that a large request sets does not outlive it: a
// small request after it, once the deadline passed, goes through, and so
// does a large one, which sets its own.
func TestLargeRequestDeadlineDoesNotStay(t *testing.T) {
	r := startTestReplica(t, Config{StreamIdleTimeout: 5 * time.Second, FirstByteTimeout: 5 * time.Second})
	c, srv := r.connect(t)
	for _, n := range []int{1000, 200 << 10} {
		c.nc.SetWriteDeadline(time.Now().Add(-time.Second)) // as if a large request's had passed
		c.writeDeadline = true
		got := serve(srv, n, "HTTP/1.1 204 No Content\r\n\r\n")
		var hd fasthttp.ResponseHeader
		if err := roundTripWithin(t, c, n, &hd, nil, nil); err != nil {
			t.Fatalf("a request of %d bytes after a passed deadline: %v", n, err)
		}
		if head, body := request(n); !bytes.Equal(<-got, append(head, body...)) {
			t.Fatal("the replica read other bytes")
		}
		c.br.Discard(c.br.Buffered())
	}
}
