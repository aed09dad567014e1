package router

import (
	"io"
	"net/http"
	"testing"
	"time"
)

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

// cancellableReplica is a replica that holds its first request for up to
// 6 s: started is closed when it has the request, cancelled when the
// request is cancelled (its connection closed) before then.
func cancellableReplica(t *testing.T) (a *replica, started, cancelled chan struct{}) {
	t.Helper()
	started, cancelled = make(chan struct{}), make(chan struct{})
	a = startReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		close(started)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(6 * time.Second):
		}
	})
	return a, started, cancelled
}
