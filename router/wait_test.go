package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/upstream"
)

// harnessRelayWaitingAbove is startProxy's Config.RelayWaitingAbove: 0, so
// that the suite's requests wait for their answer on a relay, which writes
// it (relay.go), except in TestAnswersThroughFasthttp.
var harnessRelayWaitingAbove = 0

// The tests of answers, failover and resends again with every wait in
// fasthttp's connection goroutine (RelayWaitingAbove -1), the way main's
// default takes for the first 256 requests that wait at once.
func TestAnswersThroughFasthttp(t *testing.T) {
	harnessRelayWaitingAbove = -1
	defer func() { harnessRelayWaitingAbove = 0 }()
	for name, test := range map[string]func(*testing.T){
		"ReplicaStoppedMidFlight":              TestReplicaStoppedMidFlight,
		"RestartUnderKeepAlive":                TestRestartUnderKeepAlive,
		"NoSecondSendOnceTheReplicaHadTheBody": TestNoSecondSendOnceTheReplicaHadTheBody,
		"ClientGoneCancelsTheReplica":          TestClientGoneCancelsTheReplica,
		"AllReplicasDown":                      TestAllReplicasDown,
		"StaleKeepAliveIsResentOnAFreshConn":   TestStaleKeepAliveIsResentOnAFreshConnection,
		"KilledReplicaNeverSeesASecondSend":    TestKilledReplicaNeverSeesASecondSend,
		"HungReplicaLeavesTheRotation":         TestHungReplicaLeavesTheRotation,
		"OverloadedReplicaIsRetriedElsewhere":  TestOverloadedReplicaIsRetriedElsewhere,
		"InterimAnswers":                       TestInterimAnswers,
		"ResponseConnectionHeadersAreDropped":  TestResponseConnectionHeadersAreDropped,
		"AwkwardAnswers":                       TestAwkwardAnswers,
		"HeadersPassBothWays":                  TestHeadersPassBothWays,
		"OtherPathsAndMethodsAreForwarded":     TestOtherPathsAndMethodsAreForwarded,
		"UnframedAndLargeBodies":               TestUnframedAndLargeBodies,
		"SlowBodyAfterHead":                    TestSlowBodyAfterHead,
		"SlowHead":                             TestSlowHead,
		"PanicIsContained":                     TestPanicIsContained,
		"AccessLog":                            TestAccessLog,
	} {
		t.Run(name, test)
	}
}

// Requests wait on a relay only past Config.RelayWaitingAbove waiting at
// once: with 1, the first of two requests that wait is fasthttp's and the
// second relayed. Both get their answers whole, and the relayed one's
// connection serves its next request.
func TestWaitsRelayedPastTheThreshold(t *testing.T) {
	started, release := make(chan struct{}, 2), make(chan struct{})
	var held atomic.Int64
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if held.Add(1) <= 2 {
			started <- struct{}{}
			<-release
		}
		chatReply("a")(w, r)
	})
	p := startProxy(t, RoundRobin, []string{a.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.RelayWaitingAbove = 1 })
	var conns []net.Conn
	for i := 0; i < 2; i++ {
		c := dialProxy(t, p)
		conns = append(conns, c)
		if _, err := io.WriteString(c, rawChat(chat(i, 1), "")); err != nil {
			t.Fatal(err)
		}
		<-started
	}
	// The relay takes the connection just after the replica has the
	// request.
	waitFor(t, "the second wait relayed", func() bool { return p.h.relays.n.Load() > 0 })
	if waiting, relayed := p.h.waiting.Load(), p.h.relays.n.Load(); waiting != 2 || relayed != 1 {
		t.Fatalf("%d requests waiting, %d relayed; want 2 and 1", waiting, relayed)
	}
	close(release)
	for i, c := range conns {
		br := bufio.NewReader(c)
		for j := 0; j < 2; j++ {
			body := chat(i, 1+2*j)
			if j > 0 {
				io.WriteString(c, rawChat(body, ""))
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("connection %d, request %d: %v", i, j, err)
			}
			got, err := io.ReadAll(resp.Body)
			if want := fmt.Sprintf(`"bytes":%d}`, len(body)); err != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(got), want) {
				t.Fatalf("connection %d, request %d: %d %q, %v; want 200 and a body ending %s", i, j, resp.StatusCode, got, err, want)
			}
		}
	}
	if waiting := p.h.waiting.Load(); waiting != 0 {
		t.Fatalf("%d requests waiting after their answers, want 0", waiting)
	}
}

// rawChat is a raw HTTP/1.1 POST of body to /v1/chat/completions, with
// extra header lines.
func rawChat(body, extra string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// A relay writes every answer of a request whose wait it took: a HEAD's,
// its head alone with the replica's Content-Length; and the proxy's own,
// a 502 when the replica took the request and closed its connection
// without an answer, then a 503 while that replica is demoted. Each is
// framed so that the client's next request on the connection is served.
func TestRelayWritesEveryAnswer(t *testing.T) {
	var n atomic.Int64
	a := startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("User-Agent") == upstream.ProbeUserAgent {
			probeAnswer(w, r)
			return
		}
		if n.Add(1) == 2 {
			// The request read whole: closing on unread bytes would
			// send a reset, which says that it was never read.
			io.ReadAll(r.Body)
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "10")
		if r.Method != http.MethodHead {
			io.WriteString(w, `{"ok":"1"}`)
		}
	})
	p := startProxy(t, RoundRobin, []string{a.url()})
	c := dialProxy(t, p)
	br := bufio.NewReader(c)
	io.WriteString(c, "HEAD /v1/models/x HTTP/1.1\r\nHost: p\r\n\r\n")
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodHead})
	if err != nil || resp.StatusCode != 200 || resp.ContentLength != 10 {
		t.Fatalf("HEAD: %v %v", resp, err)
	}
	for _, want := range []struct {
		status int
		header string
	}{{502, "X-Warmroute-Replica"}, {503, "Retry-After"}} {
		io.WriteString(c, rawChat(chat(1, 1), ""))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("after the HEAD: %v", err)
		}
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want.status || !strings.Contains(string(got), `"type":`) || resp.Header.Get(want.header) == "" || resp.Close {
			t.Fatalf("%d %q %v (close %v); want a %d with a JSON error and %s, the connection kept", resp.StatusCode, got, resp.Header, resp.Close, want.status, want.header)
		}
	}
	if p.h.relays.n.Load() == 0 {
		t.Fatal("the connection is not the relay's: its waits were not relayed")
	}
}

func TestSpliceHost(t *testing.T) {
	for _, tc := range []struct{ host, want string }{
		{"10.0.0.1:8000", "POST / HTTP/1.1\r\nHost: 10.0.0.1:8000\r\nA: b\r\n\r\n"},
		{"h:1", "POST / HTTP/1.1\r\nHost: h:1\r\nA: b\r\n\r\n"},
		{"a-much-longer-replica-name.internal:8000", "POST / HTTP/1.1\r\nHost: a-much-longer-replica-name.internal:8000\r\nA: b\r\n\r\n"},
	} {
		head := []byte("POST / HTTP/1.1\r\nHost: 127.0.0.1:8001\r\nA: b\r\n\r\n")
		at := len("POST / HTTP/1.1\r\nHost: ")
		if got := string(spliceHost(head, at, len("127.0.0.1:8001"), []byte(tc.host))); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.host, got, tc.want)
		}
	}
}

// A body of known length that its replica cuts is answered 502, not passed
// on truncated, whether fasthttp's goroutine or a relay waited for it: the
// body is read whole before the head goes out. The request is not sent
// again, and the connection serves the next request.
func TestCutBodyIsA502(t *testing.T) {
	for _, above := range []int{-1, 0} {
		t.Run(fmt.Sprintf("relay waiting above %d", above), func(t *testing.T) {
			var sends atomic.Int64
			a := rawReplica(t, false, func() []byte {
				sends.Add(1)
				return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"cut\":")
			})
			p := startProxy(t, RoundRobin, []string{a}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.RelayWaitingAbove = above })
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			for i := 0; i < 2; i++ {
				io.WriteString(c, rawChat(chat(i, 1), ""))
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				got, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != 502 || !strings.Contains(string(got), `"type":`) {
					t.Fatalf("request %d: %d %q, %v; want a whole 502", i, resp.StatusCode, got, err)
				}
			}
			if n := sends.Load(); n != 2 {
				t.Fatalf("the replica saw %d sends of 2 requests", n)
			}
		})
	}
}
