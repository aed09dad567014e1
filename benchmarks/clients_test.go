package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/openai/openai-go/responses"

	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/router"
)

// responsesTurn is one turn of a Responses conversation as the client saw it.
type responsesTurn struct {
	id, text, replica, route string
	input, cached            int64
}

// respond sends one Responses request with the official client, streamed
// or not, and reads it to the end.
func respond(ctx context.Context, client openai.Client, params responses.ResponseNewParams, stream bool) (responsesTurn, error) {
	var raw *http.Response
	var resp responses.Response
	var text strings.Builder
	if stream {
		s := client.Responses.NewStreaming(ctx, params, option.WithResponseInto(&raw))
		for s.Next() {
			switch ev := s.Current(); ev.Type {
			case "response.output_text.delta":
				text.WriteString(ev.AsResponseOutputTextDelta().Delta)
			case "response.completed":
				resp = ev.AsResponseCompleted().Response
			}
		}
		if err := s.Err(); err != nil {
			return responsesTurn{}, err
		}
		if resp.ID == "" {
			return responsesTurn{}, errors.New("the stream ended without response.completed")
		}
		if resp.OutputText() != text.String() {
			return responsesTurn{}, fmt.Errorf("deltas %q, completed output %q", text.String(), resp.OutputText())
		}
	} else {
		r, err := client.Responses.New(ctx, params, option.WithResponseInto(&raw))
		if err != nil {
			return responsesTurn{}, err
		}
		resp = *r
	}
	return responsesTurn{id: resp.ID, text: resp.OutputText(), replica: raw.Header.Get("X-Warmroute-Replica"),
		route: raw.Header.Get("X-Warmroute-Route"), input: resp.Usage.InputTokens, cached: resp.Usage.InputTokensDetails.CachedTokens}, nil
}

// TestOpenAIResponsesConversation runs a three-turn Responses conversation
// with the official OpenAI client, each turn chained to the last by
// previous_response_id and sending only its new input, streamed and not,
// under adaptive routing and under round-robin: every turn after the first
// reaches the replica that stores the conversation (any other answers 404)
// and finds the last turn's prompt in its cache.
func TestOpenAIResponsesConversation(t *testing.T) {
	for _, policy := range []router.Policy{router.Adaptive, router.RoundRobin} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/stream=%v", policy, stream), func(t *testing.T) {
				e := startEnv(t, policy, 2, simConfig(200))
				client := openai.NewClient(option.WithBaseURL(e.proxy+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
				ctx := context.Background()
				inputs := []string{"Here is the repository:\n" + workload.Text(11, 40_000), "Now fix the bug.", "And write a test."}
				var turns []responsesTurn
				for i, input := range inputs {
					params := responses.ResponseNewParams{
						Model: "sim-30b", Instructions: openai.String("You are a coding agent."), MaxOutputTokens: openai.Int(4),
						Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)},
					}
					if i > 0 {
						params.PreviousResponseID = openai.String(turns[i-1].id)
					}
					turn, err := respond(ctx, client, params, stream)
					if err != nil {
						t.Fatalf("turn %d: %v", i+1, err)
					}
					if turn.text != "tok tok tok tok " || !strings.HasPrefix(turn.id, "resp_") || turn.replica == "" {
						t.Fatalf("turn %d: %+v", i+1, turn)
					}
					if i > 0 {
						last := turns[i-1]
						if turn.replica != last.replica {
							t.Fatalf("turn %d went to %s (%s), the conversation is stored on %s", i+1, turn.replica, turn.route, last.replica)
						}
						if turn.cached < last.input-16 || turn.input <= last.input {
							t.Fatalf("turn %d: %d of %d input tokens cached, want the last turn's %d", i+1, turn.cached, turn.input, last.input)
						}
					}
					turns = append(turns, turn)
				}
				if turns[0].input < 9_000 || turns[0].cached != 0 {
					t.Fatalf("turn 1: %+v", turns[0])
				}
			})
		}
	}
}

// TestResponsesOnAStoppedReplica: a previous_response_id stored on a
// replica that was stopped gets a 404 at once through the proxy, streamed
// or not, without reaching the other replica (which cannot have it) and
// without waiting for a health check to find the replica down.
func TestResponsesOnAStoppedReplica(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			e := startEnv(t, router.Adaptive, 2, simConfig(200))
			client := openai.NewClient(option.WithBaseURL(e.proxy+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
			ctx := context.Background()
			params := responses.ResponseNewParams{Model: "sim-30b", MaxOutputTokens: openai.Int(2),
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hello")}}
			first, err := respond(ctx, client, params, stream)
			if err != nil {
				t.Fatal(err)
			}
			home, other := e.sims[0], e.sims[1]
			if first.replica != home.Addr() {
				home, other = other, home
			}
			home.Stop()
			before := other.Requests()
			params.PreviousResponseID = openai.String(first.id)
			params.Input = responses.ResponseNewParamsInputUnion{OfString: openai.String("Next")}
			start := time.Now()
			// The first request finds the replica down as it is sent to it,
			// the later ones know: each is answered 404 at once, saying
			// where the response lived, and none goes to another replica.
			var apiErr *openai.Error
			for i := 1; i <= 3; i++ {
				_, err = respond(ctx, client, params, stream)
				if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, first.id) {
					t.Fatalf("request %d for a response stored on a stopped replica: %v", i, err)
				}
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("the 404s took %v", took)
			}
			if other.Requests() != before {
				t.Fatal("the request went to a replica that cannot hold the stored response")
			}
		})
	}
}

// TestAnthropicClient runs a three-turn conversation with the official
// Anthropic Go SDK, streamed, through warmroute's /v1/messages: each turn
// re-sends the history, turns 2 and 3 are pinned to the replica of turn 1,
// and it reads the earlier prompt from its cache.
func TestAnthropicClient(t *testing.T) {
	e := startEnv(t, router.Adaptive, 2, simConfig(200))
	client := anthropic.NewClient(anthropicoption.WithBaseURL(e.proxy), anthropicoption.WithAPIKey("sk-ant-test"), anthropicoption.WithMaxRetries(0))
	ctx := context.Background()
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Here is the repository:\n" + workload.Text(12, 40_000)))}
	var replica string
	var lastPrompt int64
	for turn := 1; turn <= 3; turn++ {
		var raw *http.Response
		stream := client.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model: "sim-30b", MaxTokens: 4, Messages: msgs,
			System: []anthropic.TextBlockParam{{Text: "You are Claude Code."}},
		}, anthropicoption.WithResponseInto(&raw))
		var msg anthropic.Message
		for stream.Next() {
			if err := msg.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		if len(msg.Content) != 1 || msg.Content[0].Text != "tok tok tok tok " || msg.StopReason != anthropic.StopReasonMaxTokens {
			t.Fatalf("turn %d: %+v", turn, msg)
		}
		u := msg.Usage
		got, route := raw.Header.Get("X-Warmroute-Replica"), raw.Header.Get("X-Warmroute-Route")
		if turn == 1 {
			replica = got
			if u.CacheReadInputTokens != 0 || u.InputTokens < 9_000 || route != "spread" {
				t.Fatalf("turn 1 (%s): %+v", route, u)
			}
		} else {
			if got != replica || route != "pinned" {
				t.Fatalf("turn %d went to %s (%s), want %s pinned", turn, got, route, replica)
			}
			if u.CacheReadInputTokens < lastPrompt-16 {
				t.Fatalf("turn %d read %d tokens from the cache, want the last prompt's %d", turn, u.CacheReadInputTokens, lastPrompt)
			}
		}
		if u.OutputTokens != 4 {
			t.Fatalf("turn %d: %d output tokens", turn, u.OutputTokens)
		}
		lastPrompt = u.InputTokens + u.CacheReadInputTokens
		msgs = append(msgs, msg.ToParam(), anthropic.NewUserMessage(anthropic.NewTextBlock(fmt.Sprintf("Turn %d: go on.", turn+1))))
	}
}
