package router

import (
	"bufio"
	"io"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/upstream"
)

// A replica's head field whose name is not a token (RFC 9110 5.1) never
// reaches the client, as such a trailer does not (validTrailers) and such
// a request header is refused at the front door: a strict client parser
// would fail on the whole answer. The answer is relayed without the field,
// or refused as a 502.
func TestReplicaFieldNameNotATokenIsNotRelayed(t *testing.T) {
	for _, field := range []string{"X A: b", "X/Y: b", "X\"Q: b"} {
		t.Run(field, func(t *testing.T) {
			url := rawReplica(t, true, func() []byte {
				return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + field + "\r\nContent-Length: 2\r\n\r\n{}")
			})
			p := startProxy(t, Adaptive, []string{url})
			c := dialProxy(t, p)
			br := bufio.NewReader(c)
			io.WriteString(c, rawChat(chat(1, 1), ""))
			var head strings.Builder
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("head %q: %v", head.String(), err)
				}
				if line == "\r\n" {
					break
				}
				head.WriteString(line)
				if i := strings.IndexByte(line, ':'); i > 0 && !strings.HasPrefix(line, "HTTP/") && !upstream.IsToken([]byte(line[:i])) {
					t.Fatalf("the field %q reached the client", strings.TrimSpace(line))
				}
			}
			status := head.String()[9:12]
			if status != "200" && status != "502" {
				t.Fatalf("status %s, want 200 without the field or 502", status)
			}
		})
	}
}
