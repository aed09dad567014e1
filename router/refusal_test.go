package router

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/upstream"
)

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
