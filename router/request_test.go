package router

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A request's path through the proxy (request.go), from Serve to finish:
// the answer and its interim heads relayed, the replica's faults met on
// the way, each answered so that the client's connection serves on and no
// request that a replica may have run is sent again, clients that leave,
// the bound on the whole answer, and panics.

// bodyDigest answers with the sha256 of the request's body and the Host it
// was sent to, and counts the request in sends.
func bodyDigest(name string, sends *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sends.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Replica-Saw-Host", r.Host)
		fmt.Fprintf(w, `{"replica":%q,"sha":%q,"len":%d}`, name, digestOf(string(b)), len(b))
	}
}

func digestOf(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
}

// A replica that sends part of a head and closes had the request: a 502,
// never sent again though sends are left, and the connection serves the
// request pipelined behind it.
func TestReplicaClosesMidHead(t *testing.T) {
	var n atomic.Int64
	url := rawReplica(t, false, func() []byte {
		if n.Add(1) == 1 {
			return []byte("HTTP/1.1 200 OK\r\nContent-Ty")
		}
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	})
	p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.MaxSends = 3 })
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), "")+rawChat(chat(2, 1), ""))
	if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 502 || resp.Close {
		t.Fatalf("%d %q close %v; want a 502, the connection kept", resp.StatusCode, got, resp.Close)
	}
	if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
		t.Fatalf("the pipelined request: %d %q", resp.StatusCode, got)
	}
	if n.Load() != 2 {
		t.Fatalf("the replica had %d requests, want 2: none sent twice", n.Load())
	}
	settled(t, p)
}

// A replica's head that cannot be read as HTTP, or whose framing is
// ambiguous, is a 502: the replica may have run the request, so it is not
// sent again; the connection to the replica is not reused (the replica
// keeps it open and would frame the next answer after the bad one); and
// the client's connection serves its next, pipelined, request. So is an
// interim answer that its replica does not follow with a whole final one.
func TestMalformedHeadIsABadGateway(t *testing.T) {
	big := strings.Repeat("a", 5000) // past the replica connection's 4 KiB read buffer
	for _, tt := range []struct {
		name, answer string
		closes       bool // the replica closes its connection after the answer
	}{
		{"head over 4 KiB", "HTTP/1.1 200 OK\r\nX-Big: " + big + "\r\nContent-Length: 2\r\n\r\n{}", false},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}", false},
		{"length past int64", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n{}", false},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\n{}", false},
		{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", false},
		{"a coding other than chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n{}", false},
		{"status not a number", "HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\n{}", false},
		{"a line without a colon", "HTTP/1.1 200 OK\r\nBogus\r\nContent-Length: 2\r\n\r\n{}", false},
		{"not HTTP", "SSH-2.0-OpenSSH_9.6\r\n\r\n", false},
		{"100 Continue, then the end", "HTTP/1.1 100 Continue\r\n\r\n", true},
		{"102 Processing, then half a head", "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\nContent-Le", true},
		{"101 Switching Protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int64
			url := rawReplica(t, !tt.closes, func() []byte {
				if n.Add(1) == 1 {
					return []byte(tt.answer)
				}
				return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			})
			p := startProxy(t, RoundRobin, []string{url})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			start := time.Now()
			io.WriteString(c, rawChat(chat(1, 1), "")+rawChat(chat(2, 1), ""))
			resp, got := readAnswer(t, br, "POST")
			if resp.StatusCode != 502 || !strings.Contains(got, `"upstream_error"`) || resp.Close {
				t.Fatalf("%d %q (close %v), want a 502 upstream_error, the connection kept", resp.StatusCode, got, resp.Close)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the 502 took %v: the proxy waited for bytes that were never due", d)
			}
			if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
				t.Fatalf("the next request: %d %q", resp.StatusCode, got)
			}
			if got := n.Load(); got != 2 {
				t.Fatalf("the replica had %d requests, want 2: the first was sent again", got)
			}
			settled(t, p)
		})
	}
}

// An answer that its replica writes a byte at a time, each its own TCP
// segment, is read across as many reads: its head, a length-framed body,
// and a chunked stream's sizes, data, line ends and trailers, each split
// at every byte. The client gets the answer whole, and the connection to
// the replica serves the next request.
func TestAnswerTrickledByteByByte(t *testing.T) {
	for _, tt := range []struct{ name, answer, body, trailer string }{
		{"sized", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}", `{"ok":true}`, ""},
		{"chunked stream with a trailer", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n" +
			"9\r\ndata: a\n\n\r\ne;ext=1\r\ndata: [DONE]\n\n\r\n0\r\nX-Sum: 7\r\n\r\n", "data: a\n\ndata: [DONE]\n\n", "7"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int64
			url := scriptedReplica(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
				io.Copy(io.Discard, req.Body)
				if n.Add(1) > 1 {
					_, err := io.WriteString(c, jsonAnswer("{}"))
					return err == nil
				}
				for i := 0; i < len(tt.answer); i++ {
					if _, err := c.Write([]byte{tt.answer[i]}); err != nil {
						return false
					}
					time.Sleep(200 * time.Microsecond) // the replica's pace, not a synchronisation
				}
				return true
			})
			p := startProxy(t, Adaptive, []string{url})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			io.WriteString(c, rawChat(chat(1, 1), ""))
			resp, got := readAnswer(t, br, "POST")
			if resp.StatusCode != 200 || got != tt.body || resp.Trailer.Get("X-Sum") != tt.trailer {
				t.Fatalf("%d %q trailer %q, want 200 %q trailer %q", resp.StatusCode, got, resp.Trailer.Get("X-Sum"), tt.body, tt.trailer)
			}
			io.WriteString(c, rawChat(chat(2, 1), ""))
			if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != "{}" {
				t.Fatalf("the next request: %d %q", resp.StatusCode, got)
			}
			if n.Load() != 2 {
				t.Fatalf("the replica had %d requests, want 2", n.Load())
			}
			settled(t, p)
		})
	}
}

// A body of known length that its replica cuts is answered 502, not passed
// on truncated: the body is read whole before the head goes out. The
// request is not sent again, and the connection serves the next request.
func TestCutBodyIsA502(t *testing.T) {
	var sends atomic.Int64
	a := rawReplica(t, false, func() []byte {
		sends.Add(1)
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"cut\":")
	})
	p := startProxy(t, RoundRobin, []string{a})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		io.WriteString(c, rawChat(chat(i, 1), ""))
		if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 502 || !strings.Contains(got, `"type":`) {
			t.Fatalf("request %d: %d %q; want a whole 502", i, resp.StatusCode, got)
		}
	}
	if n := sends.Load(); n != 2 {
		t.Fatalf("the replica saw %d sends of 2 requests", n)
	}
}

// A replica that writes bytes after a whole answer, once the answer was
// relayed, has put an answer to no request on a pooled connection: the
// next request on that connection must not get those bytes as its answer
// (and each later one the answer to the request before it).
func TestStrayBytesAfterAnAnswerAreNoAnswer(t *testing.T) {
	stray, strayWritten := make(chan struct{}), make(chan struct{})
	var n atomic.Int64
	url := scriptedReplica(t, func(c net.Conn, br *bufio.Reader, req *http.Request) bool {
		io.Copy(io.Discard, req.Body)
		i := n.Add(1)
		if _, err := io.WriteString(c, jsonAnswer(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			return false
		}
		if i == 1 {
			<-stray
			io.WriteString(c, jsonAnswer(`{"n":"stray"}`))
			close(strayWritten)
		}
		return true
	})
	p := startProxy(t, Adaptive, []string{url})
	rc := dialRaw(t, p.addr)
	if _, resp, body := rc.do(chat(1, 1)); resp.StatusCode != 200 || body != `{"n":1}` {
		t.Fatalf("first answer: %d %q", resp.StatusCode, body)
	}
	close(stray)
	within(t, strayWritten, 5*time.Second, "stray bytes written")
	for i := 2; i <= 3; i++ {
		if _, resp, body := rc.do(chat(i, 1)); resp.StatusCode != 200 || body != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("request %d got %d %q, want its own answer {\"n\":%d}", i, resp.StatusCode, body, i)
		}
	}
	settled(t, p)
}

// Interim answers are never taken as the final one: a 100 is consumed, a
// 103 reaches the client with its Link headers, and the final answer follows
// on the same connection, whose next request gets its own answer.
func TestInterimAnswers(t *testing.T) {
	for _, tt := range []struct {
		name    string
		interim string
		want    []string // interim heads the client sees
	}{
		{"100 Continue", "HTTP/1.1 100 Continue\r\n\r\n", nil},
		{"102 Processing", "HTTP/1.1 102 Processing\r\n\r\n", nil},
		{"103 Early Hints", "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n", []string{"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"}},
		{"100 then 103", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n", []string{"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var n atomic.Int64
			url := rawReplica(t, true, func() []byte {
				body := fmt.Sprintf(`{"answer":%d}`, n.Add(1))
				return []byte(tt.interim + fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
			})
			p := startProxy(t, Adaptive, []string{url})
			rc := dialRaw(t, p.addr)
			for i := 1; i <= 2; i++ {
				interim, resp, body := rc.do(chat(i, 1))
				if resp.StatusCode != 200 || body != fmt.Sprintf(`{"answer":%d}`, i) {
					t.Fatalf("request %d on one connection: %d %q, want 200 with its own answer", i, resp.StatusCode, body)
				}
				if strings.Join(interim, "|") != strings.Join(tt.want, "|") {
					t.Fatalf("request %d: interim heads %q, want %q", i, interim, tt.want)
				}
			}
		})
	}
}

// A 103 forwarded to the client is not the answer: a 503 after it, with
// another replica live, sends the request there, and the client gets the
// 103 and then that replica's answer; its connection serves on.
func TestEarlyHintsThenRejectedGoesElsewhere(t *testing.T) {
	var sendsB atomic.Int64
	a := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
	})
	b := startReplica(t, "b", bodyDigest("b", &sendsB))
	p := startProxy(t, RoundRobin, []string{a, b.url()})
	rc := dialRaw(t, p.addr)
	interim, resp, body := rc.do(chat(1, 1))
	if resp.StatusCode != 200 || !strings.Contains(body, digestOf(chat(1, 1))) || len(interim) != 1 || !strings.Contains(interim[0], "</a>") {
		t.Fatalf("%d %q, interim %q; want the 103, then b's answer", resp.StatusCode, body, interim)
	}
	if _, resp, body = rc.do(chat(2, 1)); resp.StatusCode != 200 || !strings.Contains(body, digestOf(chat(2, 1))) {
		t.Fatalf("the next request: %d %q", resp.StatusCode, body)
	}
	settled(t, p)
}

// A request that fails over twice: the first replica answers 503, the next
// one's listener is gone (a dial failure, no send), and the third answers.
// The body, larger than a socket's first write, and the Host of the replica
// that answers reach it whole.
func TestFailoverPastARejectAndADialFailure(t *testing.T) {
	var sendsA, sendsB atomic.Int64
	lnC := listenLoopback(t)
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		sendsA.Add(1)
		lnC.Close() // C goes before the second pick
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(503)
	})
	b := startReplica(t, "b", bodyDigest("b", &sendsB))
	bURL := "http://localhost:" + strings.Split(b.addr, ":")[1]
	p := startProxy(t, RoundRobin, []string{a.url(), bURL, "http://" + lnC.Addr().String()},
		func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.MaxSends = 3 })
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100<<10) + `"}]}`
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(body, ""))
	resp, got := readAnswer(t, br, "POST")
	if want := fmt.Sprintf(`{"replica":"b","sha":%q,"len":%d}`, digestOf(body), len(body)); resp.StatusCode != 200 || got != want {
		t.Fatalf("%d %q; want 200 %q", resp.StatusCode, got, want)
	}
	if h := resp.Header.Get("X-Replica-Saw-Host"); h != strings.TrimPrefix(bURL, "http://") {
		t.Fatalf("b saw Host %q, want %q", h, strings.TrimPrefix(bURL, "http://"))
	}
	if sendsA.Load() != 1 || sendsB.Load() != 1 {
		t.Fatalf("sends: a %d, b %d; want 1 and 1", sendsA.Load(), sendsB.Load())
	}
	if !strings.Contains(p.logs.String(), "phase=dial") {
		t.Fatalf("no dial failed: the test did not test it\n%s", p.logs)
	}
	io.WriteString(c, rawChat(chat(1, 1), ""))
	if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || !strings.Contains(got, digestOf(chat(1, 1))) {
		t.Fatalf("the next request: %d %q", resp.StatusCode, got)
	}
	settled(t, p)
}

// A 503 dropped so that another replica can take the request leaves nothing
// of its head in the answer that the client gets: a 502 from the next
// replica carries none of the 503's headers, and keeps the connection
// though the 503 said Connection: close.
func TestErrorAfterARejectCarriesNoneOfItsHead(t *testing.T) {
	var n atomic.Int64
	handler := func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			io.ReadAll(r.Body)
			w.Header().Set("Retry-After", "0")
			w.Header().Set("X-Poison", "from the 503")
			w.Header().Set("Connection", "close")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(503)
			io.WriteString(w, "busy")
			return
		}
		hangUp(w, r)
	}
	r1, r2 := startReplica(t, "r1", handler), startReplica(t, "r2", handler)
	p := startProxy(t, RoundRobin, []string{r1.url(), r2.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	resp, got := readAnswer(t, br, "POST")
	if resp.StatusCode != 502 || !strings.Contains(got, `"type":`) || resp.Close {
		t.Fatalf("%d %q close %v; want a 502, the connection kept", resp.StatusCode, got, resp.Close)
	}
	for _, h := range []string{"X-Poison", "Content-Encoding", "Retry-After"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("the 502 came with the 503's %s: %q", h, v)
		}
	}
	if n.Load() != 2 {
		t.Fatalf("%d sends, want 2", n.Load())
	}
}

// A client that asks Connection: close gets it on the proxy's own error,
// and the connection closes after it: a request pipelined behind is not
// served.
func TestClientCloseOnAnError(t *testing.T) {
	a := startReplica(t, "a", hangUp)
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(chat(1, 1), "Connection: close\r\n")+rawChat(chat(2, 1), ""))
	if resp, _ := readAnswer(t, br, "POST"); resp.StatusCode != 502 || !resp.Close {
		t.Fatalf("%d close %v; want a 502 with Connection: close", resp.StatusCode, resp.Close)
	}
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("more after a Connection: close answer: %q %v", b, err)
	}
	if a.requests.Load() != 1 {
		t.Fatalf("the replica had %d requests, want 1", a.requests.Load())
	}
}

// A client that leaves while its request waits for the replica cancels the
// replica's request, and the exchange is counted as client_gone and logged
// as 499 with its path; every count comes back.
func TestClientLeavesAWait(t *testing.T) {
	arrived, gone := make(chan struct{}), make(chan struct{})
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		close(arrived)
		<-r.Context().Done()
		close(gone)
	})
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.AccessLog = true })
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	<-arrived
	c.Close()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the replica's request was not cancelled")
	}
	settled(t, p)
	waitFor(t, "client_gone counted", func() bool {
		return p.metric(t, `warmroute_upstream_sends_total{replica="`+a.addr+`",result="client_gone"}`) == "1"
	})
	waitFor(t, "the access log line", func() bool { return strings.Contains(p.logs.String(), "msg=request") })
	if logs := p.logs.String(); !strings.Contains(logs, "path=/v1/chat/completions") || !strings.Contains(logs, "status=499") {
		t.Fatalf("no 499 access log line with the path:\n%s", logs)
	}
	if p.set.Replica(0).State() != upstream.Live {
		t.Fatal("a client leaving demoted the replica")
	}
}

// A client that pipelined its next request and then closed its connection
// has left: its waiting request is cancelled (the replica sees its
// connection closed) within the poll interval, not at the first-byte
// timeout. The unread pipelined bytes hide the end of the stream from a
// one-byte peek.
func TestClientThatPipelinedAndLeftCancelsTheReplica(t *testing.T) {
	a, started, cancelled := cancellableReplica(t)
	p := startProxy(t, Adaptive, []string{a.url()})
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	within(t, started, 5*time.Second, "request at the replica")
	io.WriteString(c, rawChat(chat(2, 1), ""))
	c.Close()
	within(t, cancelled, 3*time.Second, "cancellation at the replica after the client left")
	settled(t, p)
}

// Clients that leave at every point of their exchange, many at once: as
// soon as they sent, once the head came, in the middle of a stream, with a
// request pipelined behind, or after the whole answer. Once they are gone
// nothing of theirs is left counted on a replica, and the proxy's
// goroutines come back.
func TestClientsLeavingAtEveryPoint(t *testing.T) {
	slow := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for i := 0; i < 40; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"chunk\":%d}\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
	a, b := startReplica(t, "a", slow), startReplica(t, "b", nil)
	p := startProxy(t, RoundRobin, []string{a.url(), b.url()})
	// Warm: the proxy's own goroutines (listener, watchers) are running.
	if r := post(p, "/v1/chat/completions", chat(0, 1)); r.err != nil {
		t.Fatal(r.err)
	}
	before := runtime.NumGoroutine()
	const clients = 60
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			req := rawChat(chat(i, 1+i%3), "")
			switch i % 6 {
			case 0: // leaves as soon as it sent
				io.WriteString(c, req)
			case 1: // leaves once the head came
				io.WriteString(c, req)
				br.ReadString('\n')
			case 2: // leaves in the middle of the body
				io.WriteString(c, req)
				if resp, err := http.ReadResponse(br, nil); err == nil {
					resp.Body.Read(make([]byte, 1))
				}
			case 3: // pipelines a second request and leaves after the first answer
				io.WriteString(c, req+req)
				if resp, err := http.ReadResponse(br, nil); err == nil {
					io.ReadAll(resp.Body)
				}
			case 4: // sends half its body and leaves
				io.WriteString(c, req[:len(req)-10])
			default: // reads the whole answer
				io.WriteString(c, req)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- fmt.Errorf("client %d: %v", i, err)
					return
				}
				if _, err := io.ReadAll(resp.Body); err != nil || resp.StatusCode != 200 {
					errs <- fmt.Errorf("client %d: %d %v", i, resp.StatusCode, err)
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	settled(t, p)
	if got := p.metric(t, `warmroute_upstream_sends_total{replica="`+a.addr+`",result="client_gone"}`); got == "" || got == "0" {
		t.Fatalf("no send ended with its client gone (%q): the clients left too late to test anything", got)
	}
	waitFor(t, "the proxy's goroutines back", func() bool { return runtime.NumGoroutine() <= before+2 })
	if r := post(p, "/v1/chat/completions", chat(1, 1)); r.status != 200 {
		t.Fatalf("after the churn: %d %v", r.status, r.err)
	}
}

// The access log has a line for every answer: a HEAD's, with no bytes, and
// the proxy's own 502, each with method, path, model, replica, route and
// status.
func TestAccessLogOfEveryAnswer(t *testing.T) {
	var n atomic.Int64
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			hangUp(w, r)
			return
		}
		chatReply("a")(w, r)
	})
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.AccessLog = true })
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, "HEAD /v1/models HTTP/1.1\r\nHost: p\r\n\r\n")
	readAnswer(t, br, "HEAD")
	io.WriteString(c, rawChat(chat(2, 1), ""))
	if resp, _ := readAnswer(t, br, "POST"); resp.StatusCode != 502 {
		t.Fatalf("%d", resp.StatusCode)
	}
	settled(t, p)
	waitFor(t, "two access log lines", func() bool { return p.logs.count("request") == 2 })
	logs := p.logs.String()
	for _, want := range []string{"method=POST path=/v1/chat/completions model=m replica=" + a.addr + " route=spread status=502",
		"method=HEAD path=/v1/models model=\"\" replica=" + a.addr + " route=spread status=200"} {
		if !strings.Contains(logs, want) {
			t.Errorf("no access log line with %q", want)
		}
	}
	if strings.Count(logs, "bytes=0") != 1 {
		t.Errorf("want one line of bytes=0, the HEAD's:\n%s", logs)
	}
}

// The replica's head reaches the client as it was sent: no Content-Type
// that the replica did not send, its own Date and none added.
func TestAnswersAddNoHeaders(t *testing.T) {
	for _, tt := range []struct{ name, answer, method string }{
		{"sized", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: Mon, 01 Jan 2001 00:00:00 GMT\r\n\r\n{}", "POST"},
		{"stream", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "POST"},
		{"HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "HEAD"},
	} {
		url := rawReplica(t, true, func() []byte { return []byte(tt.answer) })
		p := startProxy(t, RoundRobin, []string{url})
		c := dialProxy(t, p)
		br := bufio.NewReader(c)
		if tt.method == "HEAD" {
			io.WriteString(c, rawHead(""))
		} else {
			io.WriteString(c, rawChat(chat(1, 1), ""))
		}
		resp, _ := readAnswer(t, br, tt.method)
		if ct := resp.Header.Get("Content-Type"); ct != "" {
			t.Errorf("%s: Content-Type %q added", tt.name, ct)
		}
		sent := strings.Contains(tt.answer, "Date:")
		if d := resp.Header.Values("Date"); sent && (len(d) != 1 || d[0] != "Mon, 01 Jan 2001 00:00:00 GMT") || !sent && len(d) != 0 {
			t.Errorf("%s: Date %q; the replica sent one: %v", tt.name, d, sent)
		}
	}
}

// Requests of many sizes on several connections at once, every other one
// that goes to a sent again after its 503, each reach their replica whole
// and unmixed: a body's buffer is not shared with another request's.
func TestBodiesStayWholeThroughResends(t *testing.T) {
	var sends atomic.Int64
	var seen atomic.Int64
	reject := func(next http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if seen.Add(1)%2 == 0 {
				io.ReadAll(r.Body)
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(503)
				return
			}
			next(w, r)
		}
	}
	a := startReplica(t, "a", reject(bodyDigest("a", &sends)))
	b := startReplica(t, "b", bodyDigest("b", &sends))
	p := startProxy(t, RoundRobin, []string{a.url(), b.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize, s.BodyBudget = 4<<20, 64<<20
	})
	const conns, reqs = 4, 20
	errs := make(chan error, conns)
	for g := 0; g < conns; g++ {
		go func(g int) {
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(c)
			for i := 0; i < reqs; i++ {
				body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(string(rune('a'+g)), (i*9770)%(160<<10)) + fmt.Sprint(g, i) + `"}]}`
				io.WriteString(c, rawChat(body, ""))
				resp, err := http.ReadResponse(br, nil)
				var got []byte
				if err == nil {
					got, err = io.ReadAll(resp.Body)
				}
				if err == nil && (resp.StatusCode != 200 || !strings.Contains(string(got), digestOf(body))) {
					err = fmt.Errorf("%d %q", resp.StatusCode, got)
				}
				if err != nil {
					errs <- fmt.Errorf("connection %d, request %d: %w", g, i, err)
					return
				}
			}
			errs <- nil
		}(g)
	}
	for g := 0; g < conns; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := sends.Load(); n != conns*reqs {
		t.Fatalf("%d answers for %d requests", n, conns*reqs)
	}
	settled(t, p)
}

// A replica that resets its connection in the middle of a large request
// never had it whole: the request goes to another replica, which gets it
// whole, and the client its answer.
func TestResetMidRequestGoesElsewhere(t *testing.T) {
	reset := make(chan struct{}, 4)
	a := resetMidRequest(t, 40<<10, reset)
	var sends atomic.Int64
	b := startReplica(t, "b", bodyDigest("b", &sends))
	p := startProxy(t, RoundRobin, []string{a, b.url()}, func(_ *upstream.Config, _ *Config, s *ServerConfig) {
		s.MaxBodySize = 4 << 20
	})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("y", 1<<20) + `"}]}`
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, rawChat(body, ""))
	resp, got := readAnswer(t, br, "POST")
	if want := fmt.Sprintf(`{"replica":"b","sha":%q,"len":%d}`, digestOf(body), len(body)); resp.StatusCode != 200 || got != want {
		t.Fatalf("%d %q; want 200 %q", resp.StatusCode, got, want)
	}
	select {
	case <-reset:
	default:
		t.Fatal("the request did not go to the replica that resets: the test tested nothing")
	}
	// Met in the write, or, when the socket buffers took the whole
	// request, as a reset before any answer.
	if logs := p.logs.String(); !strings.Contains(logs, "phase=write") && !strings.Contains(logs, "await (reset)") {
		t.Fatalf("the reset was not met:\n%s", logs)
	}
	settled(t, p)
}

// -response-timeout bounds a whole stream, however steadily it flows, and
// the wait for an answer that never comes: a 504 long before
// -first-byte-timeout.
func TestResponseTimeoutBoundsTheWholeAnswer(t *testing.T) {
	url := trickler(t, time.Millisecond)
	p := startProxy(t, Adaptive, []string{url}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.ResponseTimeout = 300 * time.Millisecond
	})
	c := dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	readCut(t, c)
	if !strings.Contains(p.logs.String(), upstream.ErrResponseTimeout.Error()) {
		t.Errorf("the cut's log line does not name the response timeout")
	}

	silent := startReplica(t, "silent", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	p = startProxy(t, Adaptive, []string{silent.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
		u.ResponseTimeout = 300 * time.Millisecond // FirstByteTimeout is 10 s
	})
	c = dialProxy(t, p)
	io.WriteString(c, rawChat(chat(1, 1), ""))
	if resp, body := readAnswer(t, bufio.NewReader(c), "POST"); resp.StatusCode != 504 {
		t.Fatalf("%d %s, want 504", resp.StatusCode, body)
	}
}

// A panic in one request, driven through the real handler (a pin map that
// is missing, so the policy dereferences nil), is answered 500 with a JSON
// error and logged; the process, and other requests, go on.
func TestPanicIsContained(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	p.h.pins = nil // before any request: the handler reads it only while serving
	r := post(p, "/v1/chat/completions", chat(1, 3))
	if r.err != nil || r.status != 500 || !strings.Contains(r.body, `"type":"internal_error"`) || !r.close {
		t.Fatalf("after a panic: %v %d %s (connection close %v)", r.err, r.status, r.body, r.close)
	}
	if !strings.Contains(p.logs.String(), "panic=") || !strings.Contains(p.logs.String(), "router.Choose") {
		t.Fatalf("the panic was not logged with its stack:\n%s", p.logs)
	}
	if r := post(p, "/v1/models", ""); r.status != 200 {
		t.Fatalf("the proxy did not stay up: %d %v", r.status, r.err)
	}
	// A fresh request gets as far as the replica's answer before the
	// policy records it and panics: the connection it held is closed and
	// the replica's in-flight count comes back to 0.
	if r := post(p, "/v1/chat/completions", chat(2, 1)); r.status != 500 {
		t.Fatalf("a panic after the send: %d %s", r.status, r.body)
	}
	if n := p.set.Replica(0).InFlight(); n != 0 {
		t.Fatalf("in flight after a panic = %d, want 0", n)
	}
}

// panicInAStream runs a Responses stream whose first event panics in the
// proxy (its map of response ids is missing), after the handler returned,
// on fasthttp's writing of the stream; it returns what the client read.
func panicInAStream(t *testing.T) (*proxy, string) {
	t.Helper()
	url := rawReplica(t, true, func() []byte {
		ev := "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n"
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + sizeLine(len(ev)) + ev + "\r\n0\r\n\r\n")
	})
	p := startProxy(t, RoundRobin, []string{url})
	p.h.responses = nil
	c := dialProxy(t, p)
	io.WriteString(c, "POST /v1/responses HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("the client's connection after a panic in its stream: %q, %v; want it closed", got, err)
	}
	return p, string(got)
}

// A panic in a stream, on fasthttp's goroutine, is contained: the client's
// connection closes without a whole answer, every count comes back, the
// proxy serves on, and the panic is logged as an error.
func TestPanicInAStreamIsContained(t *testing.T) {
	p, got := panicInAStream(t)
	if strings.Contains(got, "\r\n0\r\n\r\n") {
		t.Fatalf("a stream cut by a panic ended as a whole one: %q", got)
	}
	settled(t, p)
	if r := post(p, "/v1/models", ""); r.status != 200 {
		t.Fatalf("the proxy did not stay up: %d %v", r.status, r.err)
	}
	t.Run("logged", func(t *testing.T) {
		if !strings.Contains(p.logs.String(), "level=ERROR") {
			t.Fatalf("the panic was not logged as an error:\n%s", p.logs)
		}
	})
}
