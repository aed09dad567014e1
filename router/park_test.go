package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// relayWaitGoroutines counts the goroutines inside a relay's wait for the
// first byte or for a stream's next: one per wait that blocks its
// goroutine.
func relayWaitGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			s := string(buf[:n])
			return strings.Count(s, "router.(*exchange).awaitAnswer(") + strings.Count(s, "router.(*exchange).writeStream(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Relayed waits for a replica's first byte, and relayed streams between
// their events, are parked on the poller: while twenty of them wait, no
// goroutine is inside a relay, and every stream still arrives whole.
func TestParkedWaitsHoldNoGoroutine(t *testing.T) {
	if relayPoller() == nil {
		t.Skip("no poller on this system: waits block their goroutine")
	}
	const n = 20
	started := make(chan struct{}, n)
	first, second := make(chan struct{}), make(chan struct{})
	a := startReplica(t, "a", sse(2, func(i int) {
		if i == 0 {
			started <- struct{}{}
			<-first
		} else {
			<-second
		}
	}))
	p := startProxy(t, RoundRobin, []string{a.url()})
	before, idle := relayPoller().Parked(), relayWaitGoroutines() // other tests' may linger
	conns := make([]net.Conn, n)
	readers := make([]*bufio.Reader, n)
	for i := range conns {
		conns[i] = dialProxy(t, p)
		readers[i] = bufio.NewReader(conns[i])
		if _, err := io.WriteString(conns[i], streamRequest("")); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		<-started
	}
	parked := func(phase string) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d waits parked %s", n, phase), func() bool { return relayPoller().Parked()-before >= n })
		if g := relayWaitGoroutines(); g > idle {
			t.Fatalf("%s: %d goroutines inside a relay's wait with %d waits parked, want %d as before", phase, g, n, idle)
		}
	}
	parked("before the first byte")
	close(first)
	resps := make([]*http.Response, n)
	for i, br := range readers {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		resps[i] = resp
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || line != "data: {\"chunk\":0}\n" {
			t.Fatalf("stream %d: first line %q, %v", i, line, err)
		}
	}
	parked("between two events")
	close(second)
	for i, resp := range resps {
		rest, err := io.ReadAll(resp.Body)
		if err != nil || !strings.HasSuffix(string(rest), "data: {\"chunk\":1}\n\ndata: [DONE]\n\n") {
			t.Fatalf("stream %d: rest %q, %v", i, rest, err)
		}
	}
}

// The tests of relayed waits and streams again with every wait blocking its
// relay's goroutine, as where no poller can start (parkWaits false).
func TestWaitsBlockWithoutAPoller(t *testing.T) {
	parkWaits = false
	defer func() { parkWaits = true }()
	for name, test := range map[string]func(*testing.T){
		"ReplicaStoppedMidFlight":              TestReplicaStoppedMidFlight,
		"NoSecondSendOnceTheReplicaHadTheBody": TestNoSecondSendOnceTheReplicaHadTheBody,
		"ClientGoneCancelsTheReplica":          TestClientGoneCancelsTheReplica,
		"HungReplicaLeavesTheRotation":         TestHungReplicaLeavesTheRotation,
		"InterimAnswers":                       TestInterimAnswers,
		"SlowBodyAfterHead":                    TestSlowBodyAfterHead,
		"SlowHead":                             TestSlowHead,
		"RelayWritesEveryAnswer":               TestRelayWritesEveryAnswer,
		"StreamArrivesChunkByChunk":            TestStreamArrivesChunkByChunk,
		"ReplicaDiesMidStream":                 TestReplicaDiesMidStream,
		"ClientThatStopsReadingIsCut":          TestClientThatStopsReadingIsCut,
		"TrailersAreRelayed":                   TestTrailersAreRelayed,
	} {
		t.Run(name, test)
	}
}
