package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/upstream"
)

// Headers on their way through the proxy (header.go): a request's to its
// replica, hop-by-hop ones dropped whatever their case and X-Forwarded-For
// extended, and an answer's to the client, with none that a strict client
// would fail on.

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{"Connection", true},
		{"connection", true},
		{"KEEP-ALIVE", true}, // the same length as Connection
		{"Te", true},
		{"tE", true},
		{"X-Forwarded-For", true},
		{"Proxy-Authorization", true},
		{"Content-Type", false},
		{"Connectiom", false}, // a length in the set, not a name in it
		{"Connections", false},
		{"Hos", false},
		{"", false},
		{strings.Repeat("x", 200), false},
	} {
		if got := hopByHop.has([]byte(tc.key)); got != tc.want {
			t.Errorf("hopByHop.has(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
	if n := len(hopByHop.list); n != 13 {
		t.Errorf("hopByHop lists %d names, want 13", n)
	}
	if !credentials.has([]byte("x-api-key")) || credentials.has([]byte("X-Api-Keys")) {
		t.Error("credentials: X-Api-Key is one, X-Api-Keys is not")
	}
}

func TestHeadersPassBothWays(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	r := post(p, "/v1/chat/completions?x=1", chat(1, 1),
		"Authorization", "Bearer sk-test", "X-Custom", "kept", "X-Forwarded-For", "10.9.8.7",
		"Connection", "keep-alive, X-Hop", "X-Hop", "dropped", "Te", "trailers")
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	want := map[string]string{
		"X-Replica-Saw-Auth":   "Bearer sk-test",
		"X-Replica-Saw-Custom": "kept",
		"X-Replica-Saw-Xff":    "10.9.8.7, 127.0.0.1",
		"X-Replica-Saw-Hop":    "",
		"X-Replica-Saw-Host":   a.addr,
		"X-Replica-Saw-Path":   "/v1/chat/completions?x=1",
		"Keep-Alive":           "",
		"Content-Type":         "application/json",
		"X-Warmroute-Replica":  a.addr,
		"X-Warmroute-Route":    "spread",
	}
	for k, v := range want {
		if got := r.header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if !strings.Contains(r.body, `"replica":"a"`) {
		t.Errorf("body %q", r.body)
	}
}

// Header names are matched in any case: a client that writes them in lower
// case has its Connection-named headers dropped and its X-Forwarded-For
// extended as one that writes them canonically.
func TestHopByHopNamesInAnyCase(t *testing.T) {
	a := startReplica(t, "a", nil)
	p := startProxy(t, Adaptive, []string{a.url()})
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := chat(1, 1)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"+
		"connection: keep-alive, x-hop\r\nx-hop: dropped\r\nx-forwarded-for: 10.1.1.1\r\ncontent-length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if hop, xff := resp.Header.Get("X-Replica-Saw-Hop"), resp.Header.Get("X-Replica-Saw-Xff"); resp.StatusCode != 200 || hop != "" || xff != "10.1.1.1, 127.0.0.1" {
		t.Fatalf("status %d; the replica saw X-Hop %q, X-Forwarded-For %q", resp.StatusCode, hop, xff)
	}
}

// Headers that a response's Connection header names are hop-by-hop, like
// the fixed list: they do not reach the client.
func TestResponseConnectionHeadersAreDropped(t *testing.T) {
	url := rawReplica(t, true, func() []byte {
		return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\n{}")
	})
	p := startProxy(t, Adaptive, []string{url})
	r := post(p, "/v1/chat/completions", chat(1, 1))
	if r.status != 200 || r.body != "{}" {
		t.Fatalf("%d %q", r.status, r.body)
	}
	for k, want := range map[string]string{"X-Hop": "", "Keep-Alive": "", "X-Kept": "yes"} {
		if got := r.header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if c := r.header.Get("Connection"); strings.Contains(strings.ToLower(c), "x-hop") {
		t.Errorf("Connection %q reached the client", c)
	}
}

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
