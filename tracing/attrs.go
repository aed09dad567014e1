package tracing

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// Attrs are what the router knows of a request when it ends, set on its
// span by End. Each field is left off the span when it is unknown (empty,
// or the value said below), so a collector tells "none" from "not known".
type Attrs struct {
	// Replica is the name of the replica that answered (the last one
	// sent to); empty when none was.
	Replica string
	// Route is why the replica was picked: the router's route reason
	// (pinned, spread, session, failover, ...).
	Route string
	// Policy is the routing policy's name.
	Policy string
	// Model is the model the request asked for.
	Model string
	// PredictedCachedBytes is how much of the prompt's rendering the
	// policy believed the replica held; negative when it made no guess.
	PredictedCachedBytes int64
	// CachedTokens is the prompt tokens the engine reported it found
	// cached; -1 when it reported none.
	CachedTokens int
	// PromptTokens is the prompt tokens the engine reported; -1 when it
	// reported none.
	PromptTokens int
	// TTFT is the time from the request in to its first response byte
	// from the replica; 0 when none came.
	TTFT time.Duration
	// Sends is how many times the request was sent to a replica.
	Sends int
	// Status is the HTTP status the client got; 0 when it got none (it
	// left first).
	Status int
	// Verdict is the router's failure verdict (not sent, maybe running,
	// mid-stream, ...), empty when the request did not fail. A verdict, or
	// a status of 500 or more, makes the span's status an error.
	Verdict string
}

// The GenAI names are OpenTelemetry's GenAI semantic conventions. They
// left the main conventions at v1.42 for a repository of their own
// (open-telemetry/semantic-conventions-genai), which has no Go package, so
// they are spelled here as in semconv v1.41.0.
const (
	genAIRequestModel    = attribute.Key("gen_ai.request.model")
	genAIInputTokens     = attribute.Key("gen_ai.usage.input_tokens")
	genAICacheReadTokens = attribute.Key("gen_ai.usage.cache_read.input_tokens")
	replicaKey           = attribute.Key("warmroute.replica")
	routeKey             = attribute.Key("warmroute.route")
	policyKey            = attribute.Key("warmroute.policy")
	predictedCachedKey   = attribute.Key("warmroute.predicted_cached_bytes")
	sendsKey             = attribute.Key("warmroute.sends")
	verdictKey           = attribute.Key("warmroute.verdict")
	ttftKey              = attribute.Key("warmroute.ttft_seconds")
)
