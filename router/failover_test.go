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
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// slowReply answers after d, and tells arrived (if not nil) that a request
// came in.
func slowReply(name string, d time.Duration, arrived chan<- string) http.HandlerFunc {
	reply := chatReply(name)
	return func(w http.ResponseWriter, r *http.Request) {
		if arrived != nil {
			arrived <- name
		}
		time.Sleep(d)
		reply(w, r)
	}
}

// The seed's measurement: replica 2 stops while six requests are in flight
// or about to be sent; all six get a 200 and one failover line is logged.
func TestReplicaStoppedMidFlight(t *testing.T) {
	arrived := make(chan string, 6)
	a, b := startReplica(t, "a", slowReply("a", 150*time.Millisecond, arrived)), startReplica(t, "b", slowReply("b", 150*time.Millisecond, arrived))
	p := startProxy(t, Adaptive, []string{a.url(), b.url()})
	results := make(chan result, 6)
	send := func(i int) { results <- post(p, "/v1/chat/completions", chat(i, 1)) }
	for i := 0; i < 3; i++ {
		go send(i)
	}
	onB := 0
	for i := 0; i < 3; i++ { // three requests are running
		if <-arrived == "b" {
			onB++
		}
	}
	if onB == 0 {
		t.Fatal("no request is running on b: the test would test nothing")
	}
	b.mu.Lock()
	listenerClosed := make(chan struct{})
	b.srv.RegisterOnShutdown(func() { close(listenerClosed) })
	b.mu.Unlock()
	stopped := make(chan struct{})
	go func() { b.stop(); close(stopped) }()
	<-listenerClosed // b refuses connections now, and finishes what it runs
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
	if p.set.Replica(1).State() != upstream.Down {
		t.Error("the stopped replica was not demoted")
	}
	if got := p.metric(t, "warmroute_failovers_total"); got == "0" || got == "" {
		t.Errorf("failovers counter = %q", got)
	}
}

// countingReply answers like chatReply, records each request's
// X-Request-Id in seen, and tells served about it without ever blocking.
func countingReply(name string, seen *sync.Map, served chan<- struct{}) http.HandlerFunc {
	reply := chatReply(name)
	return func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("X-Request-Id"), true)
		reply(w, r)
		select {
		case served <- struct{}{}:
		default:
		}
	}
}

// A replica restarts gracefully, three times, while requests flow through
// pooled connections: no request reaches both replicas, and the only errors
// are rare 502s. Go's http.Server closes a connection that it counts as
// idle even after it read the next request's bytes from it (they wait in
// its buffer), so the proxy sees an end of stream that acknowledged the
// whole request: the one case it cannot tell from a replica that died
// running the request, answered 502 by the rule. At most one such request
// per client and restart; engines served by uvicorn parse what they read
// before they can close, and do not have this window.
func TestRestartUnderKeepAlive(t *testing.T) {
	var seenA, seenB sync.Map
	servedB := make(chan struct{}, 1)
	a := startReplica(t, "a", countingReply("a", &seenA, nil))
	b := startReplica(t, "b", countingReply("b", &seenB, servedB))
	p := startProxy(t, Adaptive, []string{a.url(), b.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.Cooldown, u.MaxCooldown = 20*time.Millisecond, 20*time.Millisecond
	})
	const clients, rounds = 4, 3
	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprint(g*1_000_000 + i)
				r := post(p, "/v1/chat/completions", chat(g*1000+i, 1+i%3), "X-Request-Id", id)
				sent.Add(1)
				switch {
				case r.err == nil && r.status == 200:
				case r.err == nil && r.status == 502 && strings.Contains(r.body, `"type":"upstream_error"`):
					failed.Add(1)
				default:
					t.Errorf("client %d: %v %d %s", g, r.err, r.status, r.body)
				}
			}
		}(g)
	}
	waitServed := func(n int) { // b serves n requests through the proxy
		for i := 0; i < n; i++ {
			select {
			case <-servedB:
			case <-time.After(10 * time.Second):
				t.Fatalf("b served %d of %d requests", i, n)
			}
		}
	}
	for round := 0; round < rounds; round++ {
		waitServed(50)
		b.stop()
		time.Sleep(50 * time.Millisecond) // down, as a process is until it restarts
		b.restart()
	}
	waitServed(50) // readmitted and serving again
	close(stop)
	wg.Wait()
	seenA.Range(func(id, _ any) bool {
		if _, dup := seenB.Load(id); dup {
			t.Errorf("request %s reached both replicas", id)
		}
		return true
	})
	t.Logf("%d requests, %d answered 502, b served %d", sent.Load(), failed.Load(), b.requests.Load())
	if failed.Load() > clients*rounds {
		t.Errorf("%d 502s in %d graceful restarts with %d clients", failed.Load(), rounds, clients)
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

// rawRequest sends one request over a fresh connection and returns it.
func rawRequest(t *testing.T, addr, body string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return c
}

func TestClientGoneCancelsTheReplica(t *testing.T) {
	for _, streaming := range []bool{true, false} {
		t.Run(fmt.Sprintf("streaming=%v", streaming), func(t *testing.T) {
			gone := make(chan time.Time, 1)
			arrived := make(chan struct{}, 1)
			rep := startReplica(t, "r", func(w http.ResponseWriter, r *http.Request) {
				io.ReadAll(r.Body)
				arrived <- struct{}{}
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
				<-arrived // the request is running on the replica
			}
			closedAt := time.Now()
			c.Close()
			closedWithin(t, gone, closedAt, time.Second)
			if p.set.Replica(0).State() != upstream.Live {
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
	url := rawReplica(t, false, func() []byte {
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
	if p.set.Replica(0).State() != upstream.Live || p.set.Replica(0).Demotions() != 0 {
		t.Fatal("stale keep-alive connections demoted the replica")
	}
	if n := p.logs.count("failover"); n != 0 {
		t.Fatalf("%d failover lines for stale connections", n)
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="not_sent"}`); got == "0" || got == "" {
		t.Fatalf("no stale connection was met (not_sent = %q): the test did not test the resend", got)
	}
}

// A stale keep-alive connection met by a body larger than the socket's
// buffers fails in the write, not in the wait for the answer: it is
// resent once on a fresh connection as the small one is, and blames
// nobody.
func TestStaleKeepAliveMetByALargeBody(t *testing.T) {
	var served atomic.Int64
	url := rawReplica(t, false, func() []byte {
		served.Add(1)
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, s *ServerConfig) {
		u.TrustIdle = time.Hour // the stale connections are met by requests, not by a peek
		s.MaxBodySize = 16 << 20
	})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 8<<20) + `"}]}`
	const n = 4
	for i := 0; i < n; i++ {
		if r := post(p, "/v1/chat/completions", body); r.status != 200 || r.body != "{}" {
			t.Fatalf("request %d: %d %q %v", i, r.status, r.body, r.err)
		}
	}
	if got := served.Load(); got != n {
		t.Fatalf("the replica served %d requests, want %d: each exactly once", got, n)
	}
	if r := p.set.Replica(0); r.State() != upstream.Live || r.Demotions() != 0 {
		t.Fatal("stale keep-alive connections demoted the replica")
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+strings.TrimPrefix(url, "http://")+`",result="not_sent"}`); got == "0" || got == "" {
		t.Fatalf("no stale connection was met (not_sent = %q): the test did not test the resend", got)
	}
	settled(t, p)
}

// A replica killed while it holds a request it read: that request is never
// sent to another replica, whatever the connection looked like, across
// three kills under load with a warm pool. Requests the killed replica had
// not read fail over.
func TestKilledReplicaNeverSeesASecondSend(t *testing.T) {
	a := startKillable(t, 40)
	b := startKillable(t, -1)
	p := startProxy(t, Adaptive, []string{"http://" + a.addr, "http://" + b.addr}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.Cooldown, u.MaxCooldown, u.HealthInterval = 20*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	})
	var id atomic.Int64
	var ok, badGateway atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				rid := fmt.Sprint(id.Add(1))
				r := post(p, "/v1/chat/completions", chat(int(id.Load()), 1), "X-Request-Id", rid)
				switch {
				case r.err == nil && r.status == 200:
					ok.Add(1)
				case r.err == nil && r.status == 502 && strings.Contains(r.body, "upstream_error"):
					// Mostly the request the replica died on; another
					// of its connections may have had its request read
					// from the socket, not yet recorded, when it died:
					// a 502 as well, by the rule.
					badGateway.Add(1)
				default:
					t.Errorf("request %s: %v %d %s", rid, r.err, r.status, r.body)
				}
			}
		}()
	}
	for round := 0; round < 3; round++ {
		select {
		case <-a.died:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: the replica never got its fatal request", round)
		}
		// Down for a while, as a process is until it is restarted: the
		// proxy meets a replica that refuses connections.
		time.Sleep(100 * time.Millisecond)
		a.restart()
	}
	close(stop)
	wg.Wait()
	twice := 0
	a.seen.Range(func(k, _ any) bool {
		if _, dup := b.seen.Load(k); dup {
			twice++
			t.Errorf("request %s was seen by both replicas", k)
		}
		return true
	})
	t.Logf("%d answered, %d 502s, %d ids seen by both", ok.Load(), badGateway.Load(), twice)
	if badGateway.Load() < 3 {
		t.Errorf("%d 502s for 3 requests that died with their replica: one was resent", badGateway.Load())
	}
}

// A replica that hangs is demoted by its probes, the requests waiting on it
// get 504 at once instead of at the first-byte timeout, and are not sent
// again; new requests avoid it.
func TestHungReplicaLeavesTheRotation(t *testing.T) {
	hung := hungReplica(t)
	good := startReplica(t, "good", nil)
	const firstByte = 30 * time.Second
	p := startProxy(t, Adaptive, []string{hung, good.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.HealthInterval, u.HealthTimeout, u.StallTimeout = 50*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
		u.FirstByteTimeout, u.Cooldown, u.MaxCooldown = firstByte, time.Hour, time.Hour
	})
	hungName := strings.TrimPrefix(hung, "http://")
	results := make(chan result, 4)
	start := time.Now()
	for i := 0; i < 4; i++ {
		go func(i int) { results <- post(p, "/v1/chat/completions", chat(i, 1)) }(i)
	}
	var timedOut int
	for i := 0; i < 4; i++ {
		r := <-results
		switch {
		case r.err == nil && r.status == 200 && r.replica == good.addr:
		case r.err == nil && r.status == 504 && r.replica == hungName && strings.Contains(r.body, "stopped answering"):
			timedOut++
		default:
			t.Fatalf("request: %v %d on %s: %s", r.err, r.status, r.replica, r.body)
		}
	}
	if d := time.Since(start); d > firstByte/3 {
		t.Fatalf("requests on the hung replica were answered after %v: they waited for the first-byte timeout", d)
	}
	if timedOut == 0 {
		t.Fatal("no request went to the hung replica: the test tested nothing")
	}
	if good.requests.Load() != int64(4-timedOut) {
		t.Fatalf("the good replica saw %d requests, want %d: a request the hung replica held was sent again", good.requests.Load(), 4-timedOut)
	}
	if p.set.Replica(0).State() != upstream.Down || p.logs.count(`"replica demoted as hung; requests waiting on it get 504"`) != 1 {
		t.Fatalf("the hung replica was not demoted as hung:\n%s", p.logs)
	}
	for i := 0; i < 10; i++ {
		if r := post(p, "/v1/chat/completions", chat(10+i, 1)); r.status != 200 || r.replica != good.addr {
			t.Fatalf("after the demotion: %d on %s", r.status, r.replica)
		}
	}
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+hungName+`",result="timeout"}`); got != fmt.Sprint(timedOut) {
		t.Errorf("timeout sends on the hung replica = %q, want %d", got, timedOut)
	}
}

// An idle replica that hangs is demoted after two probes in a row time out,
// and readmitted after a good probe once it answers again.
func TestIdleHungReplicaIsDemotedAndComesBack(t *testing.T) {
	var wedged atomic.Bool
	wedged.Store(true)
	release := make(chan struct{})
	reply := chatReply("r")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			probeAnswer(w, r)
			return
		}
		if r.URL.Path == "/health" && wedged.Load() {
			<-release
		}
		reply(w, r)
	})}
	ln := listenLoopback(t)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	t.Cleanup(func() { close(release) })
	p := startProxy(t, Adaptive, []string{"http://" + ln.Addr().String()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.HealthInterval, u.HealthTimeout = 20*time.Millisecond, 100*time.Millisecond
		u.Cooldown, u.MaxCooldown = 20*time.Millisecond, 20*time.Millisecond
	})
	// The demotion's log line comes after its state: the test waits for
	// the line, the last of the two.
	waitFor(t, "demotion", func() bool { return strings.Contains(p.logs.String(), `msg="replica demoted`) })
	if p.logs.count(`"replica demoted as hung; requests waiting on it get 504"`) != 1 || p.set.Replica(0).State() != upstream.Down {
		t.Fatalf("not demoted as hung:\n%s", p.logs)
	}
	wedged.Store(false)
	waitFor(t, "readmission", func() bool { return p.set.Replica(0).State() == upstream.Live })
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 {
		t.Fatalf("after readmission: %d %s", r.status, r.body)
	}
}

// A replica that answers 503 or 429 is skipped for its Retry-After and the
// request goes to another; a 500 is passed through and never resent, and a
// 503 with no other replica to try reaches the client as it is.
func TestOverloadedReplicaIsRetriedElsewhere(t *testing.T) {
	for _, status := range []int{503, 429} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			busy := startReplica(t, "busy", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "30")
				http.Error(w, `{"error":"overloaded"}`, status)
			})
			good := startReplica(t, "good", nil)
			p := startProxy(t, Adaptive, []string{busy.url(), good.url()})
			r := post(p, "/v1/chat/completions", chat(0, 1)) // the counter picks busy first
			if r.status != 200 || r.replica != good.addr || r.route != "failover" {
				t.Fatalf("got %d from %s (%s), want 200 from the other replica", r.status, r.replica, r.route)
			}
			for i := 1; i <= 6; i++ {
				if r := post(p, "/v1/chat/completions", chat(i, 1)); r.status != 200 || r.replica != good.addr {
					t.Fatalf("request %d during Retry-After: %d from %s", i, r.status, r.replica)
				}
			}
			if busy.requests.Load() != 1 || p.set.Replica(0).State() != upstream.Live {
				t.Fatalf("busy replica saw %d requests (want 1) and is %v (want live: skipped, not demoted)", busy.requests.Load(), p.set.Replica(0).State())
			}
			if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+busy.addr+`",result="rejected"}`); got != "1" {
				t.Errorf("rejected sends = %q, want 1", got)
			}
		})
	}
	t.Run("500 is not resent", func(t *testing.T) {
		broken := startReplica(t, "broken", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "engine error", 500)
		})
		good := startReplica(t, "good", nil)
		p := startProxy(t, Adaptive, []string{broken.url(), good.url()})
		if r := post(p, "/v1/chat/completions", chat(0, 1)); r.status != 500 || r.body != "engine error\n" || good.requests.Load() != 0 {
			t.Fatalf("got %d %q, other replica saw %d; want the 500 passed through and nothing resent", r.status, r.body, good.requests.Load())
		}
	})
	t.Run("503 with nowhere else to go", func(t *testing.T) {
		busy := startReplica(t, "busy", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		})
		p := startProxy(t, Adaptive, []string{busy.url()})
		for i := 0; i < 2; i++ { // the second while the replica is skipped: it is still the only one
			if r := post(p, "/v1/chat/completions", chat(0, 1)); r.status != 503 || r.body != "overloaded\n" || r.replica != busy.addr {
				t.Fatalf("got %d %q from %s, want the replica's own 503", r.status, r.body, r.replica)
			}
		}
	})
}

// When every replica answers 429 with a Retry-After, the client gets a
// replica's own 429 and its Retry-After, never the proxy's 503 "no live
// replica": each request goes to at most MaxSends replicas, also once all
// of them asked to be left alone (a skip is a back-off, not a demotion).
func TestEveryReplicaRejects(t *testing.T) {
	var sends atomic.Int64
	reject := func(w http.ResponseWriter, r *http.Request) {
		sends.Add(1)
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		w.Write([]byte(`{"error":"slow down"}`))
	}
	a, b, c := startReplica(t, "a", reject), startReplica(t, "b", reject), startReplica(t, "c", reject)
	p := startProxy(t, RoundRobin, []string{a.url(), b.url(), c.url()})
	for i := 0; i < 4; i++ {
		before := sends.Load()
		r := post(p, "/v1/chat/completions", chat(i, 1))
		if r.err != nil || r.status != 429 || r.body != `{"error":"slow down"}` || r.header.Get("Retry-After") != "7" {
			t.Fatalf("request %d: %d %q Retry-After %q %v; want the replica's 429", i, r.status, r.body, r.header.Get("Retry-After"), r.err)
		}
		if n := sends.Load() - before; n < 1 || n > 2 {
			t.Fatalf("request %d went to %d replicas, want 1 or 2 (MaxSends 2)", i, n)
		}
	}
	settled(t, p)
}

// A replica that refuses a large request body early (a 413 after the head,
// as cpp-httplib under llama.cpp does past its payload limit) and closes
// without reading the rest resets the proxy's write. The replica is
// there and answering: one client's large body must not take every
// replica out of rotation, and the client should get the replica's answer
// rather than 503 "no live replica".
func TestEarlyRefusalOfALargeBodyDemotesNoReplica(t *testing.T) {
	refuse := func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 17\r\n\r\n{\"error\":\"large\"}")
		return false // closed with the body unread: the kernel resets
	}
	a, b := scriptedReplica(t, refuse), scriptedReplica(t, refuse)
	p := startProxy(t, RoundRobin, []string{a, b}, func(_ *upstream.Config, _ *Config, s *ServerConfig) { s.MaxBodySize = 64 << 20 })
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 32<<20) + `"}]}`
	r := post(p, "/v1/chat/completions", body)
	for _, rep := range p.set.Replicas() {
		if rep.State() != upstream.Live {
			t.Errorf("replica %s is out of rotation after refusing one large body (state %d)", rep.Name, rep.State())
		}
	}
	if r.err != nil || r.status != 413 {
		t.Errorf("client got %d %q %v, want the replica's 413", r.status, r.body, r.err)
	}
	settled(t, p)
}

// One probe that times out demotes a replica whose requests in flight are
// silent too, and not one whose streams keep flowing: the data path
// confirms or refutes what the probe saw.
func TestOneProbeTimeoutDemotesOnlyASilentReplica(t *testing.T) {
	for _, mode := range []string{"silent", "flowing", "not streamed"} {
		silent := mode == "silent"
		t.Run(mode, func(t *testing.T) {
			release := make(chan struct{})
			slowProbes := make(chan struct{}, 100)
			var probes atomic.Int64
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/models" {
					probeAnswer(w, r)
					return
				}
				if r.URL.Path == "/health" {
					if probes.Add(1)%2 == 1 { // every other probe outlasts the timeout
						slowProbes <- struct{}{}
						select {
						case <-release:
						case <-time.After(300 * time.Millisecond):
						}
					}
					return
				}
				io.ReadAll(r.Body)
				if mode == "not streamed" {
					// Silent until the whole answer is ready, as a
					// non-streamed completion is: no evidence of a hang.
					<-release
					fmt.Fprint(w, "{}")
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				w.(http.Flusher).Flush() // the first byte: the wait for more is the silence
				for !silent {
					select {
					case <-release:
						return
					case <-time.After(10 * time.Millisecond):
						fmt.Fprint(w, "data: tok\n\n")
						w.(http.Flusher).Flush()
					}
				}
				<-release
			})}
			ln := listenLoopback(t)
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			var once sync.Once
			stop := func() { once.Do(func() { close(release) }) }
			t.Cleanup(stop)
			p := startProxy(t, Adaptive, []string{"http://" + ln.Addr().String()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
				u.HealthInterval, u.HealthTimeout, u.StallTimeout = 30*time.Millisecond, 100*time.Millisecond, time.Hour
				u.Cooldown, u.MaxCooldown = time.Hour, time.Hour
			})
			done := make(chan error, 1)
			go func() {
				resp, err := client.Post(p.url("/v1/chat/completions"), "application/json", strings.NewReader(chat(1, 1)))
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				done <- err
			}()
			probesTimedOut := func(n int) { // while the request is in flight
				for i := 0; i < n; i++ {
					select {
					case <-slowProbes:
					case <-time.After(10 * time.Second):
						t.Fatalf("%d probes, %d of %d slow ones seen", probes.Load(), i, n)
					}
				}
			}
			probesTimedOut(1)
			rep := p.set.Replica(0)
			if silent {
				select {
				case err := <-done:
					if err == nil {
						t.Fatal("the silent stream ended cleanly")
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the silent replica's stream was never cut")
				}
				if rep.State() != upstream.Down {
					t.Fatal("a replica silent on its requests survived a probe timeout")
				}
				return
			}
			probesTimedOut(3)
			stop()
			if err := <-done; err != nil {
				t.Fatalf("the flowing stream failed: %v", err)
			}
			if rep.State() != upstream.Live || rep.Demotions() != 0 {
				t.Fatalf("a replica whose answer was %s was demoted (%d probes)", mode, probes.Load())
			}
		})
	}
}
