package benchmarks

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/benchmarks/engine"
	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/upstream"
)

// The tests in this file run warmroute in front of two real llama-server
// processes (benchmarks/engine), and check against the engine's own
// answers what the simulator only models: its APIs, its prompt cache and
// how it dies.

// startEngines starts n llama-servers with the tiny model, or skips the
// test when none is built (it fails instead when CI is set).
func startEngines(t *testing.T, n int) []*engine.Server {
	dir := engine.Require(t)
	var servers []*engine.Server
	for i := 0; i < n; i++ {
		servers = append(servers, engine.Start(t, dir, engine.Options{}))
	}
	return servers
}

// engineEnv puts warmroute under policy in front of servers, with its
// defaults: llama-server closes a connection after every streamed answer
// without saying so (TestEngineClosesAfterStream), which warmroute finds
// by peeking at a connection that carried a stream before it reuses it.
func engineEnv(t *testing.T, policy router.Policy, servers []*engine.Server) *env {
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.URL)
	}
	return startReplicaEnv(t, router.Config{Policy: policy}, upstream.Config{}, urls, engine.Model)
}

// replicaOf maps a replica's X-Warmroute-Replica (host:port) to its index.
func replicaOf(servers []*engine.Server, addr string) int {
	for i, s := range servers {
		if s.URL == "http://"+addr {
			return i
		}
	}
	return -1
}

// TestEngineAPIs sends chat (whole and streamed), Responses and Messages
// requests through warmroute to llama-server, and checks the engine's
// answers came back whole, with its usage.
func TestEngineAPIs(t *testing.T) {
	servers := startEngines(t, 2)
	e := engineEnv(t, router.Adaptive, servers)
	msgs := []workload.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Say something."}}

	t.Run("chat", func(t *testing.T) {
		status, replica, body, err := post(e.proxy, "/v1/chat/completions", e.prepare(workload.Body("sim-30b", msgs, false, 8)))
		if err != nil || status != 200 {
			t.Fatalf("status %d, %v: %s", status, err, body)
		}
		var out struct {
			Choices []struct {
				Message struct{ Role, Content string }
			}
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		if replicaOf(servers, replica) < 0 || len(out.Choices) != 1 || out.Choices[0].Message.Role != "assistant" ||
			out.Usage.PromptTokens < 5 || out.Usage.CompletionTokens != 8 {
			t.Fatalf("replica %q, answer %s", replica, body)
		}
	})
	t.Run("stream", func(t *testing.T) {
		r, err := e.chat(e.proxy, streamBody(msgs, 8))
		if err != nil {
			t.Fatal(err)
		}
		// A random model's tokens may be empty strings: the chunks that
		// carried text are at most the 8 tokens asked for.
		if r.reply == "" || len(r.itl) > 7 || r.prompt < 5 || replicaOf(servers, r.replica) < 0 {
			t.Fatalf("streamed %q in %d gaps, %d prompt tokens, replica %q", r.reply, len(r.itl), r.prompt, r.replica)
		}
	})
	t.Run("responses", func(t *testing.T) {
		req := fmt.Sprintf(`{"model":%q,"instructions":"You are terse.","input":"Say something.","max_output_tokens":8}`, engine.Model)
		status, _, body, err := post(e.proxy, "/v1/responses", []byte(req))
		if err != nil || status != 200 {
			t.Fatalf("status %d, %v: %s", status, err, body)
		}
		var out struct {
			ID, Object string
			Output     []struct {
				Type    string
				Content []struct{ Type, Text string }
			}
			Usage struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		if out.Object != "response" || out.ID == "" || len(out.Output) == 0 || out.Usage.InputTokens < 5 {
			t.Fatalf("answer %s", body)
		}
	})
	t.Run("messages", func(t *testing.T) {
		// Two turns of one conversation: the second goes where the
		// first went and finds it in the engine's cache.
		text, _ := json.Marshal(workload.Text(5, 2_000))
		turn1 := fmt.Sprintf(`{"role":"user","content":%s}`, text)
		var replicas []string
		for i, msgs := range []string{turn1, turn1 + `,{"role":"assistant","content":"Read."},{"role":"user","content":"Now fix it."}`} {
			req := fmt.Sprintf(`{"model":%q,"system":"You are terse.","max_tokens":8,"messages":[%s]}`, engine.Model, msgs)
			status, replica, body, err := post(e.proxy, "/v1/messages", []byte(req))
			if err != nil || status != 200 {
				t.Fatalf("status %d, %v: %s", status, err, body)
			}
			var out struct {
				Type, Role string
				Content    []struct{ Type string }
				Usage      struct {
					InputTokens  int `json:"input_tokens"`
					OutputTokens int `json:"output_tokens"`
					CacheRead    int `json:"cache_read_input_tokens"`
				}
			}
			if err := json.Unmarshal(body, &out); err != nil {
				t.Fatal(err)
			}
			if out.Type != "message" || out.Role != "assistant" || out.Usage.InputTokens < 5 || out.Usage.OutputTokens < 1 {
				t.Fatalf("answer %s", body)
			}
			if i == 1 && out.Usage.CacheRead < 500 {
				t.Errorf("turn 2 read %d tokens from the cache, want the first turn's 700 or so: %s", out.Usage.CacheRead, body)
			}
			replicas = append(replicas, replica)
		}
		if replicas[0] != replicas[1] {
			t.Errorf("the turns went to %v", replicas)
		}
	})
}

// TestEngineAgentLoop runs a 6-turn agent loop through warmroute to two
// llama-servers. Under adaptive every turn stays on one replica and, from
// turn 2 on, llama-server reports most of the prompt cached
// (usage.prompt_tokens_details.cached_tokens); under round-robin, turn 2
// goes to the other replica, which has never seen the conversation: the
// engine reports nothing cached, so the check above can fail.
func TestEngineAgentLoop(t *testing.T) {
	servers := startEngines(t, 2)
	for _, p := range []router.Policy{router.Adaptive, router.RoundRobin} {
		t.Run(p.String(), func(t *testing.T) {
			e := engineEnv(t, p, servers)
			if _, _, err := e.agentLoop(1, 1, 6, 8_000, 1_000, 16); err != nil {
				t.Fatal(err)
			}
			turns := e.runs.runs
			if len(turns) != 6 {
				t.Fatalf("%d turns", len(turns))
			}
			for i, r := range turns {
				t.Logf("turn %d: replica %d (%s), %d of %d prompt tokens cached, TTFT %.1f ms", i+1, replicaOf(servers, r.replica), r.route, r.cached, r.prompt, r.clientTTFT)
			}
			if p == router.RoundRobin {
				if turns[1].replica == turns[0].replica || turns[1].cached*10 > turns[1].prompt {
					t.Errorf("round-robin's turn 2 went to %s and found %d of %d tokens cached: want the other replica, cold", turns[1].replica, turns[1].cached, turns[1].prompt)
				}
				return
			}
			for i, r := range turns[1:] {
				prev := turns[i]
				if r.replica != turns[0].replica {
					t.Errorf("turn %d went to %s, turn 1 to %s", i+2, r.replica, turns[0].replica)
				}
				// The previous turn's prompt is this one's prefix: the
				// engine finds all of it but the tokens where the
				// template's end of turn meets the new text.
				if r.cached <= 0 || r.cached < prev.prompt*9/10 {
					t.Errorf("turn %d: %d of %d prompt tokens cached, the previous prompt was %d", i+2, r.cached, r.prompt, prev.prompt)
				}
			}
		})
	}
}

// TestEngineKilledReplica kills one of two llama-servers with SIGKILL
// while four clients stream requests through warmroute: a request sent
// after the kill never sees an error (it is never sent to the dead
// replica, or is failed over before a byte reached the client).
func TestEngineKilledReplica(t *testing.T) {
	servers := startEngines(t, 2)
	e := engineEnv(t, router.RoundRobin, servers)
	const clients, each, killAfter = 4, 8, 6
	var (
		mu              sync.Mutex
		done            int
		killedAt        time.Time // zero until the kill returned
		before          [2]int    // replies from each replica before the kill
		after           []error   // errors of requests sent after the kill
		sentAfter, lost int
	)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				msgs := []workload.Message{{Role: "user", Content: workload.Text(int64(c*100+i), 2_000)}}
				r, err := e.chat(e.proxy, streamBody(msgs, 16))
				mu.Lock()
				done++
				switch {
				case !killedAt.IsZero() && r.start.After(killedAt):
					sentAfter++
					if err != nil {
						after = append(after, err)
					}
				case err != nil:
					lost++ // in flight on the replica as it died
				case killedAt.IsZero():
					if k := replicaOf(servers, r.replica); k >= 0 {
						before[k]++
					}
				}
				kill := done == killAfter
				mu.Unlock()
				if kill {
					servers[0].Kill()
					mu.Lock()
					killedAt = time.Now()
					mu.Unlock()
				}
			}
		}(c)
	}
	wg.Wait()
	t.Logf("before the kill: %v replies per replica; after: %d requests sent, %d failed; %d in flight at the kill failed", before, sentAfter, len(after), lost)
	if before[0] == 0 || before[1] == 0 {
		t.Fatalf("before the kill the replicas answered %v: the kill tests nothing", before)
	}
	// At the kill each other client has at most one request in flight,
	// and may start one more before the kill returns.
	if sentAfter < clients*each-killAfter-2*(clients-1) {
		t.Errorf("only %d requests were sent after the kill", sentAfter)
	}
	for _, err := range after {
		t.Errorf("a request sent after the kill failed: %v", err)
	}
}

// TestEngineClosesAfterStream pins down the llama-server behaviour that
// engineEnv works around: after a streamed answer that said nothing of
// closing, it closes the connection, so a client that keeps it for the
// next request finds it dead. When llama.cpp keeps such connections open,
// this fails, and engineEnv's workaround can go.
func TestEngineClosesAfterStream(t *testing.T) {
	srv := startEngines(t, 1)[0]
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, engine.Model)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream: %v: %q", err, rest)
	}
	if resp.Close || resp.Header.Get("Connection") == "close" {
		t.Fatalf("llama-server said it would close: %v", resp.Header)
	}
	// The connection's next read ends (EOF or a reset) rather than
	// waiting: llama-server closed it. A deadline bounds the wait if not.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := conn.Read(b[:]); err == nil || os.IsTimeout(err) {
		t.Fatalf("after the stream the connection is still open (%v): llama-server keeps it now", err)
	}
}
