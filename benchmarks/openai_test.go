package benchmarks

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/warmroute/warmroute/benchmarks/workload"
	"github.com/warmroute/warmroute/router"
)

// TestOpenAIClient talks to warmroute with the official OpenAI Go client, as
// users' agents do: a completion, then the next turn of the same
// conversation streamed, which must land on the same replica and find its
// prefix in that replica's cache.
func TestOpenAIClient(t *testing.T) {
	e := startEnv(t, router.Adaptive, 2, simConfig(200))
	client := openai.NewClient(option.WithBaseURL(e.proxy+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("You are a coding agent."),
		openai.UserMessage("Here is the repository:\n" + workload.Text(7, 40_000)),
	}
	var first *http.Response
	resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "sim-30b", Messages: msgs, MaxTokens: openai.Int(8),
	}, option.WithResponseInto(&first))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != strings.Repeat("tok ", 8) {
		t.Fatalf("completion: %+v", resp.Choices)
	}
	replica := first.Header.Get("X-Warmroute-Replica")
	if replica == "" || first.Header.Get("X-Warmroute-Route") != "spread" {
		t.Fatalf("headers: %v", first.Header)
	}

	msgs = append(msgs, openai.AssistantMessage(resp.Choices[0].Message.Content), openai.UserMessage("Now fix the bug."))
	var second *http.Response
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "sim-30b", Messages: msgs, MaxTokens: openai.Int(5),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}, option.WithResponseInto(&second))
	var acc openai.ChatCompletionAccumulator
	var usage openai.CompletionUsage
	for stream.Next() {
		chunk := stream.Current()
		acc.AddChunk(chunk)
		if chunk.Usage.PromptTokens > 0 {
			usage = chunk.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != strings.Repeat("tok ", 5) {
		t.Fatalf("streamed content %q", got)
	}
	if second.Header.Get("X-Warmroute-Replica") != replica || second.Header.Get("X-Warmroute-Route") != "pinned" {
		t.Fatalf("turn 2 went to %s (%s), want %s pinned", second.Header.Get("X-Warmroute-Replica"), second.Header.Get("X-Warmroute-Route"), replica)
	}
	if cached := usage.PromptTokensDetails.CachedTokens; cached < 9_000 {
		t.Fatalf("turn 2 found %d of %d prompt tokens cached, want the first turn's prompt (about 10k)", cached, usage.PromptTokens)
	}
}
