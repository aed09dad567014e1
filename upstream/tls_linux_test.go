package upstream

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/certtest"
)

// The evidence that Judge draws from is read from the TCP socket under
// TLS, where it means what it means without TLS: a replica that closed
// before the request came has acknowledged none of its records; one that
// read the request and closed is a plain failure, never sent again.
func TestTLSRoundTripEvidence(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	for _, tt := range []struct {
		name    string
		replica func(t *testing.T, c *Conn, srv *tlsPeer)
		signs   []Sign
		want    Verdict
	}{
		{"closed before the request came", func(t *testing.T, c *Conn, srv *tlsPeer) {
			srv.tcp.Close()
			untilArrived(t, c.sock.Conn.(*net.TCPConn))
		}, []Sign{SignReset, SignUnacked}, Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}},
		{"read the request and closed", func(t *testing.T, _ *Conn, srv *tlsPeer) {
			head, body := request(100)
			got := readRequest(srv, len(head)+len(body))
			go func() { <-got; srv.tcp.Close() }()
		}, []Sign{SignFailed}, Verdict{Result: MaybeRunning, Demote: true, Status: 502}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, accepted, _ := startTLSTestReplica(t, Config{FirstByteTimeout: 10 * time.Second, TLS: ca.ClientConfig()}, ca.ServerConfig(t, "127.0.0.1"))
			c, srv := acquire(t, r, accepted)
			tt.replica(t, c, srv)
			var hd fasthttp.ResponseHeader
			err := roundTripWithin(t, c, 100, &hd, nil, nil)
			if err == nil {
				t.Fatal("RoundTrip succeeded")
			}
			if err.Phase != PhaseAwait && (err.Phase != PhaseWrite || tt.want.Result != NotSent) || err.Phase == PhaseAwait && !slices.Contains(tt.signs, err.Sign) {
				t.Fatalf("%v: phase %v, sign %v; want PhaseAwait with one of %v", err, err.Phase, err.Sign, tt.signs)
			}
			if v := Judge(err, Attempt{Sends: 1, MaxSends: 2, Others: true}); v != tt.want {
				t.Fatalf("%v judged %+v, want %+v", err, v, tt.want)
			}
		})
	}
}

// An idle TLS connection is dropped, not reused, when its replica closed
// it, or sent bytes past its last answer: those that are still in the
// socket, and those that TLS read from it with the answer, in a record
// of their own that came in the same segment, of which the socket shows
// nothing.
func TestTLSAcquireDropsADeadIdleConnection(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	for _, tt := range []struct {
		name string
		// answer has srv answer the request; stray, when set, is what it
		// sends after the answer, and untilArrived waits for it.
		answer func(srv *tlsPeer)
		stray  func(srv *tlsPeer)
	}{
		{"clean", func(srv *tlsPeer) { srv.Write([]byte(answer)) }, nil},
		{"closed", func(srv *tlsPeer) { srv.Write([]byte(answer)) }, func(srv *tlsPeer) { srv.Close() }},
		{"stray record in the socket", func(srv *tlsPeer) { srv.Write([]byte(answer)) }, func(srv *tlsPeer) { srv.Write([]byte("HTTP/1.1 200 OK\r\n")) }},
		{"stray record read with the answer", func(srv *tlsPeer) {
			srv.out.hold()
			srv.Write([]byte(answer))
			srv.Write([]byte("HTTP/1.1 200 OK\r\n"))
			srv.out.send()
		}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, accepted, _ := startTLSTestReplica(t, Config{TrustIdle: -1, TLS: ca.ClientConfig()}, ca.ServerConfig(t, "127.0.0.1"))
			c, srv := acquire(t, r, accepted)
			head, body := request(10)
			req := readRequest(srv, len(head)+len(body))
			go func() { <-req; tt.answer(srv) }()
			var resp fasthttp.Response
			if err := roundTripWithin(t, c, 10, &resp.Header, nil, nil); err != nil {
				t.Fatal(err)
			}
			if err := c.ReadWhole(&resp, 0); err != nil || string(resp.Body()) != "ok" {
				t.Fatalf("body %q, %v", resp.Body(), err)
			}
			if c.Buffered() != 0 {
				t.Fatalf("%d bytes past the answer in the read buffer: the case tests nothing", c.Buffered())
			}
			c.Release(time.Now())
			if tt.stray != nil {
				tt.stray(srv)
				untilArrived(t, c.sock.Conn.(*net.TCPConn))
			}
			again, _ := acquire(t, r, accepted)
			if dead := tt.name != "clean"; (again == c) == dead {
				t.Fatalf("Acquire reused the connection: %v; want %v", again == c, !dead)
			}
		})
	}
}

// A wait for an answer that takes several poll intervals reads through
// TLS: each poll's deadline passes without breaking the TLS connection,
// and the answer is read whole.
func TestTLSAnswerAfterSeveralPolls(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	r, accepted, _ := startTLSTestReplica(t, Config{FirstByteTimeout: 10 * time.Second, TLS: ca.ClientConfig()}, ca.ServerConfig(t, "127.0.0.1"))
	c, srv := acquire(t, r, accepted)
	held, _ := clientPair(t)
	head, body := request(10)
	req := readRequest(srv, len(head)+len(body))
	go func() {
		<-req
		<-time.After(2*pollInterval + pollInterval/2) // the prefill
		srv.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	}()
	var resp fasthttp.Response
	if err := roundTripWithin(t, c, 10, &resp.Header, held, nil); err != nil || resp.Header.StatusCode() != 200 {
		t.Fatalf("%v, status %d", err, resp.Header.StatusCode())
	}
	if err := c.ReadWhole(&resp, 0); err != nil || string(resp.Body()) != "ok" {
		t.Fatalf("body %q, %v", resp.Body(), err)
	}
}
