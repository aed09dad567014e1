package router

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/metrics"
	"testing"
	"time"
)

// messages is a slog handler that sends each record's message to a
// channel, so that a test waits for a log line without polling.
type messages chan string

func (m messages) Enabled(context.Context, slog.Level) bool { return true }
func (m messages) Handle(_ context.Context, r slog.Record) error {
	m <- r.Message
	return nil
}
func (m messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m messages) WithGroup(string) slog.Handler      { return m }

// retained is the memory that the Go runtime holds and has not given back
// to the system.
func retained() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}

// await waits for the log message want, skipping others; the test's
// deadline passing first is a failure.
func await(t *testing.T, m messages, want string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case got := <-m:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %q logged within 20 s", want)
		}
	}
}

// After a storm of client connections, each of which sent a request and
// keeps its connection open, the memory they held goes back to the
// system once they have closed: what the runtime retains comes back
// within 2x of before the storm.
func TestMemoryGivenBackAfterAConnectionStorm(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	m := make(messages, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go GiveBackMemory(ctx, p.srv, 20*time.Millisecond, slog.New(m))
	before := retained()
	var conns []net.Conn
	for range 1000 {
		c := dialProxy(t, p)
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		conns = append(conns, c)
	}
	for _, c := range conns { // each answered: the server holds all of them
		if _, err := readAnswerErr(bufio.NewReader(c)); err != nil {
			t.Fatal(err)
		}
	}
	await(t, m, "connection storm")
	peak := retained()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	await(t, m, "memory given back after a connection storm")
	after := retained()
	t.Logf("retained: %d KiB before, %d KiB in the storm, %d KiB after", before>>10, peak>>10, after>>10)
	if after > 2*before {
		t.Errorf("retained %d KiB after the storm, more than twice the %d KiB before", after>>10, before>>10)
	}
}

// readAnswerErr reads one answer from br, body and all.
func readAnswerErr(br *bufio.Reader) (string, error) {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
