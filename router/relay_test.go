package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

// streamRequest is a raw HTTP/1.1 request for a chat stream, with extra
// header lines.
func streamRequest(extra string) string { return rawChat(chat(1, 3), extra) }

// readStream reads one answer from br and checks that it is the stream of
// n events that sse(n, nil) sends.
func readStream(t *testing.T, br *bufio.Reader, n int) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || strings.Count(string(got), "data: ") != n+1 || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Fatalf("stream body %q, %v", got, err)
	}
	return resp
}

func dialProxy(t *testing.T, p *proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// A relayed stream's connection goes back to the server when the stream
// ends: the client's next request on it is served, whether it comes after
// the stream or was sent with the first request (pipelined, read by
// fasthttp before the relay took the connection over).
// fasthttp's body stream (RelayAbove -1) does the same.
func TestRelayedConnectionServesAgain(t *testing.T) {
	for _, above := range []int{0, -1} {
		t.Run(fmt.Sprintf("relay above %d", above), func(t *testing.T) { servesAgain(t, above) })
	}
}

func servesAgain(t *testing.T, above int) {
	a := startReplica(t, "a", sse(3, nil))
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.RelayAbove = above })
	t.Run("after", func(t *testing.T) {
		c := dialProxy(t, p)
		br := bufio.NewReader(c)
		for i := 0; i < 3; i++ {
			if _, err := io.WriteString(c, streamRequest("")); err != nil {
				t.Fatal(err)
			}
			readStream(t, br, 3)
		}
	})
	t.Run("pipelined", func(t *testing.T) {
		c := dialProxy(t, p)
		br := bufio.NewReader(c)
		if _, err := io.WriteString(c, streamRequest("")+streamRequest("")+streamRequest("")); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			readStream(t, br, 3)
		}
	})
}

// A client that asks for its connection to close gets Connection: close on
// the stream's head, and the connection closes after the stream.
func TestRelayedStreamClosesWhenAsked(t *testing.T) {
	a := startReplica(t, "a", sse(2, nil))
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, streamRequest("Connection: close\r\n")); err != nil {
		t.Fatal(err)
	}
	resp := readStream(t, br, 2)
	if !resp.Close {
		t.Fatalf("head without Connection: close: %v", resp.Header)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the stream: %q, %v; want the connection closed", b, err)
	}
}

// The server's Shutdown does not wait for a relayed stream, whose
// connection it handed over: StreamsDone does, and after StopStreams the
// connection closes when its stream ends instead of serving again.
func TestStreamsDoneWaitsForRelayedStreams(t *testing.T) {
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
	if _, err := io.WriteString(c, streamRequest("")); err != nil {
		t.Fatal(err)
	}
	<-started
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	beginDrain(t, p, "a stream still relayed")
	close(release)
	got, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
		t.Fatalf("stream body %q, %v", got, err)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the stream: %q, %v; want the connection closed", b, err)
	}
	drainEnds(t, p)
}

// beginDrain begins p's drain as main does, StopStreams and then the
// server's Shutdown, and checks that StreamsDone waits for what is still
// held: it returns the error of a context done already.
func beginDrain(t *testing.T, p *proxy, held string) {
	t.Helper()
	p.h.StopStreams()
	if err := p.srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.h.StreamsDone(expired); err == nil {
		t.Fatalf("StreamsDone returned nil with %s", held)
	}
}

// drainEnds checks that p's StreamsDone returns within 10 s.
func drainEnds(t *testing.T, p *proxy) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.h.StreamsDone(ctx); err != nil {
		t.Fatalf("StreamsDone after the last answer: %v", err)
	}
}

// A relayed stream's connection then waits for its next request as
// fasthttp waits between two requests: for IdleTimeout, and it closes
// without a word when none comes. (ServeConn alone would wait for
// ReadTimeout, and answer 408.)
func TestRelayedConnectionIdlesOut(t *testing.T) {
	a := startReplica(t, "a", sse(2, nil))
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.IdleTimeout, s.ReadTimeout = 200*time.Millisecond, time.Minute
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, streamRequest("")); err != nil {
		t.Fatal(err)
	}
	readStream(t, br, 2)
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle connection after the stream: %q, %v; want it closed", b, err)
	}
}

// Trailers go only to the client of the stream that had them: a stream of
// the same pooled exchange that ends when its replica closes sends none.
func TestRelayedStreamSendsNoStaleTrailers(t *testing.T) {
	var n atomic.Int32
	url := rawReplica(t, false, func() []byte {
		if n.Add(1)%2 == 1 {
			return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Secret\r\n\r\n" +
				"9\r\ndata: a\n\n\r\n0\r\nX-Secret: from-the-first\r\n\r\n")
		}
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: eof\n\n")
	})
	p := startProxy(t, RoundRobin, []string{url})
	for i := 0; i < 10; i++ {
		c := dialProxy(t, p)
		if _, err := io.WriteString(c, streamRequest("")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		eof := string(got) == "data: eof\n\n"
		if secret := resp.Trailer.Get("X-Secret"); eof == (secret != "") {
			t.Fatalf("answer %d %q came with the trailer %q", i, got, secret)
		}
	}
}

// Streams are relayed only past Config.RelayAbove open at once: with 1,
// the first of two open streams is fasthttp's and the second relayed, and
// both reach their clients whole.
func TestRelayAbove(t *testing.T) {
	started, release := make(chan struct{}, 2), make(chan struct{})
	a := startReplica(t, "a", sse(2, func(i int) {
		if i == 1 {
			started <- struct{}{}
			<-release
		}
	}))
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
		c.RelayAbove, c.RelayWaitingAbove = 1, -1
	})
	var resps []*http.Response
	var conns []net.Conn
	for i := 0; i < 2; i++ {
		c := dialProxy(t, p)
		conns = append(conns, c)
		if _, err := io.WriteString(c, streamRequest("")); err != nil {
			t.Fatal(err)
		}
		<-started
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	if open, relayed := p.h.streams.Load(), p.h.relays.n.Load(); open != 2 || relayed != 1 {
		t.Fatalf("%d streams open, %d relayed; want 2 and 1", open, relayed)
	}
	close(release)
	for _, resp := range resps {
		got, err := io.ReadAll(resp.Body)
		if err != nil || !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
			t.Fatalf("stream body %q, %v", got, err)
		}
	}
	for _, c := range conns {
		c.Close() // the relayed one waits for its next request until then
	}
	waitFor(t, "the streams to close", func() bool { return p.h.streams.Load() == 0 && p.h.relays.n.Load() == 0 })
}

// A request that comes on a relayed stream's connection just as the drain
// begins is served before the drain ends: the connection is counted from
// its stream until ServeConn is done with it, though Shutdown, which sees
// fasthttp's connections alone, saw none open. The answer, a replica's or
// the proxy's own, error or not, comes with Connection: close, so that the
// connection ends.
func TestDrainWaitsForARequestAfterARelayedStream(t *testing.T) {
	hangUp := func(w http.ResponseWriter, r *http.Request) {
		// The request read whole: closing on unread bytes (the race
		// build writes the head and the body apart) would send a reset,
		// which says that it was never read, and it would be sent again.
		io.ReadAll(r.Body)
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	}
	for _, tc := range []struct {
		name, request string
		replica       http.HandlerFunc // for the request after the stream
		status        int
		want          string
	}{
		{"a replica's answer", streamRequest(""), chatReply("a"), http.StatusOK, `"replica":"a"`},
		{"the proxy's own", "GET /health HTTP/1.1\r\nHost: p\r\n\r\n", nil, http.StatusOK, `"status"`},
		{"the proxy's error", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", nil, http.StatusMethodNotAllowed, `"error"`},
		{"a replica that hung up", streamRequest(""), hangUp, http.StatusBadGateway, `"error"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			stream := sse(2, nil)
			a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 1 {
					stream(w, r)
				} else {
					tc.replica(w, r) // fasthttp writes the answer
				}
			})
			p := startProxy(t, RoundRobin, []string{a.url()})
			serving, proceed := make(chan struct{}), make(chan struct{})
			testHookServe = func(srv *fasthttp.Server) {
				if srv == p.srv {
					serving <- struct{}{}
					<-proceed
				}
			}
			defer func() { testHookServe = nil }()
			var once sync.Once
			release := func() { once.Do(func() { close(proceed) }) }
			defer release()
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			if _, err := io.WriteString(c, streamRequest("")); err != nil {
				t.Fatal(err)
			}
			readStream(t, br, 2)
			if _, err := io.WriteString(c, tc.request); err != nil {
				t.Fatal(err)
			}
			<-serving // the request came; ServeConn has not taken the connection yet
			beginDrain(t, p, "a request about to be served")
			release()
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := io.ReadAll(resp.Body); err != nil || resp.StatusCode != tc.status || !strings.Contains(string(got), tc.want) {
				t.Fatalf("the answer in the drain: %d %q, %v; want %d", resp.StatusCode, got, err, tc.status)
			}
			if !resp.Close {
				t.Error("the answer in the drain came without Connection: close")
			}
			if b, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("after the answer: %q, %v; want the connection closed", b, err)
			}
			drainEnds(t, p)
		})
	}
}

// StopStreams closes, at once, each connection that waits for its next
// request after a relayed stream, as Shutdown closes fasthttp's idle ones:
// its client opens another rather than send a request into the drain.
func TestStopStreamsClosesIdleRelayedConnections(t *testing.T) {
	a := startReplica(t, "a", sse(2, nil))
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.IdleTimeout = time.Minute
	})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, streamRequest("")); err != nil {
		t.Fatal(err)
	}
	readStream(t, br, 2)
	waitFor(t, "the connection to wait for its next request", func() bool {
		p.h.relays.mu.Lock()
		defer p.h.relays.mu.Unlock()
		return p.h.relays.idle != nil
	})
	p.h.StopStreams()
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle connection after StopStreams: %q, %v; want it closed", b, err)
	}
}

// harnessRelayAbove is startProxy's Config.RelayAbove: 0, so that the
// suite's streams go through the relay, except in
// TestStreamsThroughFasthttp.
var harnessRelayAbove = 0

// The stream tests again with every stream written by fasthttp's body
// stream (RelayAbove -1, and no wait relayed), the way main's default takes
// for the first 64 streams open at once.
func TestStreamsThroughFasthttp(t *testing.T) {
	harnessRelayAbove, harnessRelayWaitingAbove = -1, -1
	defer func() { harnessRelayAbove, harnessRelayWaitingAbove = 0, 0 }()
	for name, test := range map[string]func(*testing.T){
		"TrailersAreRelayed":              TestTrailersAreRelayed,
		"StreamArrivesChunkByChunk":       TestStreamArrivesChunkByChunk,
		"SlowBodyAfterHead":               TestSlowBodyAfterHead,
		"ReplicaDiesMidStream":            TestReplicaDiesMidStream,
		"ClientGoneCancelsTheReplica":     TestClientGoneCancelsTheReplica,
		"ClientThatStopsReadingIsCut":     TestClientThatStopsReadingIsCut,
		"StreamOutlivesItsBodyBuffer":     TestStreamOutlivesItsBodyBuffer,
		"StreamStaysQueuedUntilFirstData": TestStreamStaysQueuedUntilItsFirstData,
		"AccessLog":                       TestAccessLog,
	} {
		t.Run(name, test)
	}
}
