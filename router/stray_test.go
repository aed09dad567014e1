package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

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
