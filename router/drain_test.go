package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// shutdown begins p's server's Shutdown, as main's drain does once it
// stops accepting, and returns once the listener is closed; the channel
// receives Shutdown's result when it returns.
func shutdown(t *testing.T, p *proxy) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.srv.ShutdownWithContext(context.Background()) }()
	waitFor(t, "the listener to close", func() bool {
		c, err := net.Dial("tcp", p.addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	return done
}

// shutdownEnds checks that a Shutdown begun by shutdown returns, without
// error, within 10 s.
func shutdownEnds(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return within 10 s of the last answer")
	}
}

// heldReplica answers each request with answer once release is closed,
// after it says on started that it has the request.
func heldReplica(t *testing.T, answer http.HandlerFunc) (r *replica, started, release chan struct{}) {
	started, release = make(chan struct{}, 1), make(chan struct{})
	r = startReplica(t, "a", func(w http.ResponseWriter, req *http.Request) {
		started <- struct{}{}
		<-release
		answer(w, req)
	})
	return r, started, release
}

// The drain (the server's Shutdown) waits for a stream that runs, which
// reaches its client whole; its connection then closes instead of serving
// again.
func TestShutdownWaitsForARunningStream(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	a := startReplica(t, "a", sse(2, func(i int) {
		if i == 1 {
			close(started)
			<-release
		}
	}))
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, streamRequest(""))
	<-started
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := shutdown(t, p)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) while a stream ran", err)
	default:
	}
	close(release)
	got, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Fatalf("the stream in the drain: %q, %v", got, err)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the stream: %q, %v; want the connection closed", b, err)
	}
	shutdownEnds(t, done)
}

// The drain waits for a request that waits for its replica: the answer, the
// replica's or the proxy's own 502 when the replica hangs up, comes whole,
// says Connection: close, and the connection closes after it.
func TestShutdownWaitsForAWaitingRequest(t *testing.T) {
	for _, tt := range []struct {
		name   string
		answer http.HandlerFunc
		status int
		want   string
	}{
		{"the replica's answer", chatReply("a"), 200, `"replica":"a"`},
		{"the proxy's 502", hangUp, 502, `"type":`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, started, release := heldReplica(t, tt.answer)
			p := startProxy(t, RoundRobin, []string{a.url()})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			io.WriteString(c, rawChat(chat(1, 1), ""))
			<-started
			done := shutdown(t, p)
			select {
			case err := <-done:
				t.Fatalf("Shutdown returned (%v) while a request waited", err)
			default:
			}
			close(release)
			resp, got := readAnswer(t, br, "POST")
			if resp.StatusCode != tt.status || !strings.Contains(got, tt.want) || !resp.Close {
				t.Fatalf("the answer in the drain: %d %q, close %v; want %d with Connection: close", resp.StatusCode, got, resp.Close, tt.status)
			}
			if b, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("after the answer: %q, %v; want the connection closed", b, err)
			}
			shutdownEnds(t, done)
			settled(t, p)
		})
	}
}

// A connection that waits for its next request after a stream is closed at
// once by the drain, as fasthttp closes its idle ones: its client opens
// another rather than send a request into the drain.
func TestShutdownClosesAnIdleConnectionAfterAStream(t *testing.T) {
	a := startReplica(t, "a", sse(2, nil))
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.IdleTimeout = time.Minute
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, streamRequest(""))
	readStream(t, br, 2)
	done := shutdown(t, p)
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle connection in the drain: %q, %v; want it closed", b, err)
	}
	shutdownEnds(t, done)
}
