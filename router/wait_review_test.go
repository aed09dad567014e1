package router

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// A request whose first send went fasthttp's way and was rejected (503,
// Retry-After) leaves that replica's head in the ctx's response header, and
// is then resent on a relay (more requests wait by now). The relay's error
// answers must not start from that head (Handler.relayBlank is taken before
// the handler touches the ctx): a later 502 carries none of the 503's
// status message, Retry-After, other headers or Connection: close.
func TestReviewRelayBlankTakesARejectedHead(t *testing.T) {
	bArrived, aArrived, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(release)
	var bSends atomic.Int64
	handler := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			switch {
			case strings.Contains(string(body), "conversation 1\""): // B
				if bSends.Add(1) == 1 {
					close(bArrived)
					<-aArrived
					w.Header().Set("Retry-After", "0")
					w.Header().Set("X-Poison", "from the 503")
					w.Header().Set("Connection", "close")
					w.Header().Set("Content-Encoding", "gzip")
					w.WriteHeader(503)
					io.WriteString(w, "busy")
					return
				}
				chatReply(name)(w, r)
			case strings.Contains(string(body), "conversation 2\""): // A, HTTP/1.0, waits
				close(aArrived)
				<-release
				chatReply(name)(w, r)
			default: // C: taken and dropped, a 502
				c, _, _ := w.(http.Hijacker).Hijack()
				c.Close()
			}
		}
	}
	r1, r2 := startReplica(t, "r1", handler("r1")), startReplica(t, "r2", handler("r2"))
	p := startProxy(t, RoundRobin, []string{r1.url(), r2.url()}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
		c.RelayWaitingAbove = 1
		c.MaxSends = 3
	})

	// B: its first send waits alone, fasthttp's way.
	cb := dialProxy(t, p)
	brb := bufio.NewReader(cb)
	io.WriteString(cb, rawChat(chat(1, 1), ""))
	<-bArrived
	if p.h.relays.n.Load() != 0 {
		t.Fatal("B's first send is relayed: the test does not test it")
	}
	// A: an HTTP/1.0 request, which waits fasthttp's way, and is counted.
	ca := dialProxy(t, p)
	body := chat(2, 1)
	io.WriteString(ca, "POST /v1/chat/completions HTTP/1.0\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body)
	// B's replica answers 503 once A waits; B is sent again, and two wait
	// now: on a relay.
	resp, got := readAnswer(t, brb, "POST")
	if resp.StatusCode != 200 || !strings.Contains(got, `"object":"chat.completion"`) {
		t.Fatalf("B: %d %q", resp.StatusCode, got)
	}
	if !strings.Contains(p.logs.String(), "failover") {
		t.Fatalf("B was not sent again")
	}
	// C waits on a relay too (A still waits), and its replica drops it:
	// the relay's own 502.
	cc := dialProxy(t, p)
	brc := bufio.NewReader(cc)
	io.WriteString(cc, rawChat(chat(3, 1), ""))
	waitFor(t, "C relayed", func() bool { return p.h.relays.n.Load() >= 1 })
	resp, got = readAnswer(t, brc, "POST")
	t.Logf("C: %s %v %q", resp.Status, resp.Header, got)
	if resp.StatusCode != 502 {
		t.Fatalf("C: %d %q", resp.StatusCode, got)
	}
	if resp.Status != "502 Bad Gateway" {
		t.Errorf("status line %q: the 503's status message", resp.Status)
	}
	for _, k := range []string{"X-Poison", "Retry-After", "Content-Encoding"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("the relay's 502 carries the rejected 503's %s: %q", k, v)
		}
	}
	if resp.Close {
		t.Errorf("the relay's 502 says Connection: close, and the connection stays open")
	}
}

// rawExchange sends req on a new connection and returns every byte that
// came back within a moment.
func rawExchange(t *testing.T, p *proxy, req string) string {
	t.Helper()
	c := dialProxy(t, p)
	io.WriteString(c, req)
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if err == io.EOF {
				out = append(out, "<EOF>"...)
			}
			break
		}
	}
	return string(out)
}

// Answers without a body, or read whole, framed the same by fasthttp and by
// a relay, byte for byte.
func TestReviewDiffBothWays(t *testing.T) {
	for _, tc := range []struct{ name, answer, req string }{
		{"HEAD unframed", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", "HEAD /v1/x HTTP/1.1\r\nHost: p\r\n\r\n"},
		{"HEAD chunked", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", "HEAD /v1/x HTTP/1.1\r\nHost: p\r\n\r\n"},
		{"HEAD sized", "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", "HEAD /v1/x HTTP/1.1\r\nHost: p\r\n\r\n"},
		{"204 CL", "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", rawChat(chat(1, 1), "")},
		{"304 CL", "HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n", rawChat(chat(1, 1), "")},
		{"304 chunked", "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", rawChat(chat(1, 1), "")},
		{"http10 reply", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", rawChat(chat(1, 1), "")},
		{"zero", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", rawChat(chat(1, 1), "")},
		{"reason", "HTTP/1.1 400 Nope Nope\r\nContent-Length: 2\r\n\r\n{}", rawChat(chat(1, 1), "")},
		{"close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", rawChat(chat(1, 1), "")},
		{"client close", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", rawChat(chat(1, 1), "Connection: close\r\n")},
		{"HEAD client close", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "HEAD /v1/x HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var outs [2]string
			for i, above := range []int{-1, 0} {
				url := rawReplica(t, true, func() []byte { return []byte(tc.answer) })
				p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) { c.RelayWaitingAbove = above })
				out := rawExchange(t, p, tc.req)
				out = strings.ReplaceAll(out, "127.0.0.1:"+strings.Split(url, ":")[2], "REPLICA")
				outs[i] = out
			}
			if outs[0] != outs[1] {
				t.Errorf("fasthttp:\n%q\nrelay:\n%q", outs[0], outs[1])
			}
		})
	}
}

// Answers of known length read whole into the request body's buffer, of
// sizes on both sides of maxKeptBody, while requests of other sizes go
// through the same pools on other connections (some sent twice): each
// client gets its own answer whole.
func TestReviewWholeAnswersInKeptBuffers(t *testing.T) {
	answer := func(w http.ResponseWriter, r *http.Request, tag string) {
		b, _ := io.ReadAll(r.Body)
		s := string(b)
		i := strings.Index(s, "#")
		j := strings.Index(s[i+1:], "#")
		key := s[i+1 : i+1+j]
		n, _ := strconv.Atoi(strings.Split(key, "/")[2])
		out := "<" + key + ">" + strings.Repeat(key[:1], n) + "<" + key + ">"
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		io.WriteString(w, out)
	}
	a := startReplica(t, "a", rejectEvery(3, func(w http.ResponseWriter, r *http.Request) { answer(w, r, "a") }))
	b := startReplica(t, "b", func(w http.ResponseWriter, r *http.Request) { answer(w, r, "b") })
	p := startProxy(t, RoundRobin, []string{a.url(), b.url()})
	key := func(g, i int) (string, int) {
		n := ((i*7919 + g*104729) % (160 << 10))
		return string(rune('a'+g)) + "/" + strconv.Itoa(i) + "/" + strconv.Itoa(n), n
	}
	onConns(t, p, 4, 30, func(g, i int) string {
		k, _ := key(g, i)
		pad := strings.Repeat("p", ((i+g)*6151)%(90<<10))
		return `{"model":"m","messages":[{"role":"user","content":"#` + k + `#` + pad + `"}]}`
	}, func(g, i int, _ string, status int, got []byte) error {
		k, n := key(g, i)
		want := "<" + k + ">" + strings.Repeat(k[:1], n) + "<" + k + ">"
		if status != 200 || string(got) != want {
			if len(got) > 200 {
				got = append(got[:100:100], got[len(got)-100:]...)
			}
			return fmt.Errorf("%d %q (len %d want %d)", status, got, len(got), len(want))
		}
		return nil
	})
	settled(t, p)
}

// The usage of a whole answer and the access log's bytes, both ways: a
// body of known length larger than the usage window, and a HEAD.
func TestReviewUsageAndLogBothWays(t *testing.T) {
	usage := `"usage":{"prompt_tokens":1000,"total_tokens":1010,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":640}}}`
	big := `{"id":"x","choices":[{"message":{"content":"` + strings.Repeat("z", 5000) + `"}}],` + usage
	for _, above := range []int{-1, 0} {
		url := rawReplica(t, true, func() []byte {
			return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big)
		})
		p := startProxy(t, RoundRobin, []string{url}, func(_ *upstream.Config, c *Config, _ *ServerConfig) {
			c.RelayWaitingAbove = above
			c.AccessLog = true
		})
		c := dialProxy(t, p)
		br := bufio.NewReader(c)
		io.WriteString(c, rawChat(chat(1, 1), ""))
		if resp, got := readAnswer(t, br, "POST"); resp.StatusCode != 200 || got != big {
			t.Fatalf("above %d: %d %d bytes", above, resp.StatusCode, len(got))
		}
		io.WriteString(c, "HEAD /v1/x HTTP/1.1\r\nHost: p\r\n\r\n")
		readAnswer(t, br, "HEAD")
		c.Close()
		settled(t, p)
		prompt, cached := p.h.m.replicaTokens(0)
		logs := p.logs.String()
		if prompt != 1000 || cached != 640 {
			t.Errorf("above %d: usage %d %d", above, prompt, cached)
		}
		if !strings.Contains(logs, "bytes="+strconv.Itoa(len(big))) || !strings.Contains(logs, "method=HEAD") || strings.Count(logs, "bytes=0") != 1 {
			t.Errorf("above %d: access log:\n%s", above, logs)
		}
	}
}
