package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"
)

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
