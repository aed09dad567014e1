package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

func slowReply(name string, d time.Duration) http.HandlerFunc {
	reply := chatReply(name)
	return func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		reply(w, r)
	}
}

// The seed's measurement: replica 2 stops while six requests are in flight
// or about to be sent; all six get a 200 and one failover line is logged.
func TestReplicaStoppedMidFlight(t *testing.T) {
	a, b := startReplica(t, "a", slowReply("a", 150*time.Millisecond)), startReplica(t, "b", slowReply("b", 150*time.Millisecond))
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	results := make(chan result, 6)
	send := func(i int) { results <- post(p, "/v1/chat/completions", chat(i, 1)) }
	for i := 0; i < 3; i++ {
		go send(i)
	}
	time.Sleep(50 * time.Millisecond) // three requests are running, one on b
	stopped := make(chan struct{})
	go func() { b.stop(); close(stopped) }()
	time.Sleep(10 * time.Millisecond) // b refuses connections now
	for i := 3; i < 6; i++ {
		go send(i)
	}
	for i := 0; i < 6; i++ {
		if r := <-results; r.err != nil || r.status != 200 {
			t.Errorf("request: %v %d %s", r.err, r.status, r.body)
		}
	}
	<-stopped
	if n := p.logs.count("failover"); n != 1 {
		t.Errorf("%d failover lines, want 1:\n%s", n, p.logs)
	}
	if p.set.Replicas[1].State() != upstream.Down {
		t.Error("the stopped replica was not demoted")
	}
	if got := p.metric(t, "warmroute_failovers_total"); got == "0" || got == "" {
		t.Errorf("failovers counter = %q", got)
	}
}

// A replica restarts while requests flow through pooled connections: no
// client sees an error.
func TestRestartUnderKeepAlive(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.Cooldown = 50 * time.Millisecond
	})
	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := post(p, "/v1/chat/completions", chat(g*1000+i, 1+i%3))
				sent.Add(1)
				if r.err != nil || r.status != 200 {
					failed.Add(1)
					t.Errorf("client %d: %v %d %s", g, r.err, r.status, r.body)
				}
			}
		}(g)
	}
	for round := 0; round < 3; round++ {
		time.Sleep(150 * time.Millisecond)
		b.stop()
		time.Sleep(100 * time.Millisecond)
		b.restart()
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("%d requests, %d failed, b served %d", sent.Load(), failed.Load(), b.requests.Load())
	if b.requests.Load() == 0 {
		t.Error("b served nothing")
	}
}

// A replica that had the whole body and then dropped the connection may be
// running the request: one send, a 502, and the other replica sees nothing.
func TestNoSecondSendOnceTheReplicaHadTheBody(t *testing.T) {
	dropper := startReplica(t, "dropper", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	})
	other := startReplica(t, "other", nil)
	p := startProxy(t, Adaptive, []string{dropper.url(), other.url()})
	r := post(p, "/v1/chat/completions", chat(1, 1))
	if r.status != 502 || !strings.Contains(r.body, `"type":"upstream_error"`) {
		t.Fatalf("got %d %s, want 502 with a JSON error", r.status, r.body)
	}
	if dropper.requests.Load() != 1 || other.requests.Load() != 0 {
		t.Fatalf("sends: dropper %d, other %d; want 1 and 0", dropper.requests.Load(), other.requests.Load())
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+dropper.addr+`",result="maybe_running"}`); got != "1" {
		t.Errorf("maybe_running sends = %q, want 1", got)
	}
}

// blackHole returns an address whose connects time out: a listener with a
// full accept queue that never accepts, so the kernel drops further SYNs.
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the accept queue until a connect times out.
	for i := 0; i < 8; i++ {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return addr
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("cannot make a black-holed listener on this kernel")
	return ""
}

func TestBlackHoleCostsTheConnectTimeoutOnce(t *testing.T) {
	const connectTimeout = 300 * time.Millisecond
	hole := blackHole(t)
	good := startReplica(t, "good", nil)
	p := startProxy(t, Adaptive, []string{"http://" + hole, good.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.ConnectTimeout = connectTimeout
		u.Cooldown = 5 * time.Second
	})
	start := time.Now()
	r := post(p, "/v1/chat/completions", chat(0, 1)) // the counter picks the hole first
	first := time.Since(start)
	if r.status != 200 || r.route != "failover" || first < connectTimeout {
		t.Fatalf("first request: %d %s after %v", r.status, r.route, first)
	}
	for i := 1; i <= 100; i++ {
		start := time.Now()
		r := post(p, "/v1/chat/completions", chat(i, 1))
		if d := time.Since(start); r.status != 200 || d >= connectTimeout {
			t.Fatalf("request %d: %d after %v; a demoted black hole must cost nothing", i, r.status, d)
		}
	}
	if n := good.requests.Load(); n != 101 {
		t.Fatalf("good replica served %d, want 101", n)
	}
}

// rawSSE writes a chunked SSE response by hand so that the test can stop it
// anywhere.
func rawSSE(events int, then func(net.Conn, *bufio.ReadWriter)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		conn, bw, _ := w.(http.Hijacker).Hijack()
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := 0; i < events; i++ {
			ev := fmt.Sprintf("data: {\"chunk\":%d}\n\n", i)
			fmt.Fprintf(bw, "%x\r\n%s\r\n", len(ev), ev)
			bw.Flush()
		}
		then(conn, bw)
	}
}

func TestReplicaDiesMidStream(t *testing.T) {
	dying := startReplica(t, "dying", rawSSE(2, func(c net.Conn, _ *bufio.ReadWriter) { c.Close() }))
	other := startReplica(t, "other", nil)
	p := startProxy(t, Adaptive, []string{dying.url(), other.url()})
	resp, err := client.Post(p.url("/v1/chat/completions"), "application/json", strings.NewReader(chat(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("a cut stream ended cleanly: %q", body)
	}
	if !strings.Contains(string(body), `"chunk":1`) {
		t.Errorf("the chunks before the cut were lost: %q", body)
	}
	if dying.requests.Load() != 1 || other.requests.Load() != 0 {
		t.Fatalf("a cut stream was retried: %d %d", dying.requests.Load(), other.requests.Load())
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+dying.addr+`",result="mid_stream"}`); got != "1" {
		t.Errorf("mid_stream sends = %q, want 1", got)
	}
}

// closedWithin waits for the replica to see its connection end.
func closedWithin(t *testing.T, gone <-chan time.Time, closedAt time.Time, limit time.Duration) {
	t.Helper()
	select {
	case at := <-gone:
		if d := at.Sub(closedAt); d > limit {
			t.Fatalf("the replica saw the close after %v, want within %v", d, limit)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the replica never saw the client leave")
	}
}

func TestClientGoneCancelsTheReplica(t *testing.T) {
	for _, streaming := range []bool{true, false} {
		t.Run(fmt.Sprintf("streaming=%v", streaming), func(t *testing.T) {
			gone := make(chan time.Time, 1)
			rep := startReplica(t, "r", func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				if streaming {
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprint(w, "data: first\n\n")
					w.(http.Flusher).Flush()
				}
				select {
				case <-r.Context().Done():
					gone <- time.Now()
				case <-time.After(10 * time.Second):
				}
			})
			p := startProxy(t, Adaptive, []string{rep.url()})
			c := rawRequest(t, p.addr, chat(1, 1))
			if streaming {
				var got []byte
				buf := make([]byte, 512)
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				for !strings.Contains(string(got), "data: first") {
					n, err := c.Read(buf)
					if err != nil {
						t.Fatalf("first event: %q %v", got, err)
					}
					got = append(got, buf[:n]...)
				}
			} else {
				time.Sleep(100 * time.Millisecond)
			}
			closedAt := time.Now()
			c.Close()
			closedWithin(t, gone, closedAt, time.Second)
			if p.set.Replicas[0].State() != upstream.Live {
				t.Fatal("a client leaving demoted the replica")
			}
			deadline := time.Now().Add(2 * time.Second)
			for p.metric(t, `warmroute_upstream_sends_total{replica="`+rep.addr+`",result="client_gone"}`) != "1" {
				if time.Now().After(deadline) {
					t.Fatal("client_gone was not counted")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

func TestAllReplicasDown(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.Cooldown = 3 * time.Second
	})
	a.close()
	b.close()
	r := post(p, "/v1/chat/completions", chat(1, 1)) // finds both refusing
	if r.status != 503 || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, `"type":"no_replica"`) {
		t.Fatalf("first request: %d %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	for i := 0; i < 5; i++ {
		start := time.Now()
		r := post(p, "/v1/chat/completions", chat(1, 1))
		if d := time.Since(start); r.status != 503 || d > 50*time.Millisecond {
			t.Fatalf("with every replica down: %d after %v", r.status, d)
		}
		if ra := r.header.Get("Retry-After"); ra != "3" && ra != "2" {
			t.Fatalf("Retry-After %q, want the cooldown left", ra)
		}
	}
}

func TestPinsToADownReplicaMove(t *testing.T) {
	a, b := startReplica(t, "a", nil), startReplica(t, "b", nil)
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	post(p, "/v1/chat/completions", chat(0, 2)) // conversation 0 on a
	r := post(p, "/v1/chat/completions", chat(1, 2))
	if r.replica != b.addr {
		t.Fatalf("conversation 1 on %s, want b", r.replica)
	}
	b.close()
	r = post(p, "/v1/chat/completions", chat(1, 4))
	if r.status != 200 || r.replica != a.addr || r.route != "failover" {
		t.Fatalf("turn 2 after b died: %d on %s (%s)", r.status, r.replica, r.route)
	}
	r = post(p, "/v1/chat/completions", chat(1, 6))
	if r.status != 200 || r.replica != a.addr || r.route != "pinned" {
		t.Fatalf("turn 3: %d on %s (%s), want pinned to a", r.status, r.replica, r.route)
	}
}

// A replica that closes each connection right after its answer, without
// saying Connection: close, leaves stale connections in the pool: each is
// found when a request fails on it unread, and the request is resent on a
// fresh connection to the same replica, with no error and no demotion.
func TestStaleKeepAliveIsResentOnAFreshConnection(t *testing.T) {
	var served atomic.Int64
	url := rawReplica(t, func() []byte {
		served.Add(1)
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	// Trust pooled connections, so that the stale ones are met by requests
	// rather than by the peek before them.
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.TrustIdle = time.Hour
	})
	for i := 0; i < 30; i++ {
		if r := post(p, "/v1/chat/completions", chat(i, 2)); r.status != 200 || r.body != "{}" {
			t.Fatalf("request %d: %d %q", i, r.status, r.body)
		}
	}
	if served.Load() != 30 {
		t.Fatalf("the replica served %d requests, want 30: each exactly once", served.Load())
	}
	if p.set.Replicas[0].State() != upstream.Live || p.set.Replicas[0].Demotions() != 0 {
		t.Fatal("stale keep-alive connections demoted the replica")
	}
	if n := p.logs.count("failover"); n != 0 {
		t.Fatalf("%d failover lines for stale connections", n)
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="not_sent"}`); got == "0" || got == "" {
		t.Fatalf("no stale connection was met (not_sent = %q): the test did not test the resend", got)
	}
}
