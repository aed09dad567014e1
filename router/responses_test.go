package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/upstream"
)

// responsesReplica answers the Responses API as vLLM does with its store
// on: each answer gets a new id kept in this replica's memory, and a
// previous_response_id that it does not hold is a 404.
func responsesReplica(t *testing.T, name string) *replica {
	var mu sync.Mutex
	stored := map[string]bool{}
	var n atomic.Int64
	return startReplica(t, name, func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Previous string `json:"previous_response_id"`
			Stream   bool   `json:"stream"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		known := req.Previous == "" || stored[req.Previous]
		id := fmt.Sprintf("resp_%s_%d", name, n.Add(1))
		if known {
			stored[id] = true
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if !known {
			w.WriteHeader(404)
			fmt.Fprintf(w, `{"error":{"message":"Response with id %q not found.","type":"invalid_request_error"}}`, req.Previous)
			return
		}
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":%q,\"object\":\"response\",\"status\":\"in_progress\"}}\n\n", id)
			w.(http.Flusher).Flush()
			fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q,\"status\":\"completed\"}}\n\n", id)
			return
		}
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","output":[{"id":"msg_1","type":"message","content":[{"type":"output_text","text":"ok"}]}]}`, id)
	})
}

// A conversation that continues by previous_response_id reaches the replica
// that stored its last response under every policy, streamed or not; when
// that replica is down the request gets a 404 at once that says so.
func TestResponsesFollowTheirStoredState(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			a, b := responsesReplica(t, "a"), responsesReplica(t, "b")
			p := startProxy(t, RoundRobin, []string{a.url(), b.url()}, func(u *upstream.Config, _ *Config, _ *ServerConfig) {
				u.Cooldown, u.MaxCooldown = time.Hour, time.Hour
			})
			idOf := func(r result) string {
				if stream {
					_, rest, _ := strings.Cut(r.body, `"response":{"id":"`)
					id, _, _ := strings.Cut(rest, `"`)
					return id
				}
				var out struct{ ID string }
				json.Unmarshal([]byte(r.body), &out)
				return out.ID
			}
			prev, home := "", ""
			for turn := 0; turn < 4; turn++ {
				body := fmt.Sprintf(`{"model":"m","input":"turn %d","stream":%v`, turn, stream)
				if prev != "" {
					body += fmt.Sprintf(`,"previous_response_id":%q`, prev)
				}
				r := post(p, "/v1/responses", body+"}")
				if r.status != 200 {
					t.Fatalf("turn %d: %d %s", turn, r.status, r.body)
				}
				if home == "" {
					home = r.replica
				} else if r.replica != home {
					t.Fatalf("turn %d went to %s, the previous response is on %s", turn, r.replica, home)
				}
				prev = idOf(r)
			}
			i := 0
			if home != p.set.Replica(0).Name {
				i = 1
			}
			p.set.Replica(i).Demote(fmt.Errorf("test"), time.Now())
			sent := a.requests.Load() + b.requests.Load()
			start := time.Now()
			r := post(p, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"next","previous_response_id":%q}`, prev))
			if r.status != 404 || !strings.Contains(r.body, "stored on a replica that is down or gone") || time.Since(start) > time.Second {
				t.Fatalf("the replica that stores the conversation is down: %d %s", r.status, r.body)
			}
			if a.requests.Load()+b.requests.Load() != sent {
				t.Fatal("the request went to a replica that cannot have its state")
			}
		})
	}
}
