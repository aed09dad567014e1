// Package sim is a simulated vLLM replica: an OpenAI-compatible server on
// loopback with a model of a GPU engine behind it, where the two things that
// routing changes are real: a prefix cache of KV blocks, and a
// continuous-batching queue. It needs no GPU and runs faster than real time
// while it reports every figure in real-scale units.
package sim

import (
	"crypto/tls"
	"time"
)

// Config is the model of one engine. The defaults are calibrated so that
// the seed's table (the reference figures the README quotes) comes out
// through warmroute:
// see DefaultConfig.
type Config struct {
	// BytesPerToken estimates tokens from bytes of rendered prompt.
	BytesPerToken int
	// BlockTokens is the size of one KV block, the unit of prefix caching.
	BlockTokens int
	// KVCapacityTokens is the KV cache size; least recently used blocks are
	// evicted past it, a prompt's tail before its head.
	KVCapacityTokens int
	// StepBase, PrefillPerToken and DecodePerSeq make one engine step last
	// StepBase + PrefillPerToken*prefill_tokens + DecodePerSeq*running, plus
	// PrefillAttention for the context of each prefilled token.
	StepBase, PrefillPerToken, DecodePerSeq time.Duration
	// PrefillAttention is the extra prefill time of one token per 1,000
	// tokens of context before it: attention makes a long prompt's prefill
	// grow with its square, and makes new tokens after a cached 90k-token
	// prefix cost more than the same tokens at the start of a prompt.
	PrefillAttention time.Duration
	// PrefillBudget is the most prompt tokens one step prefills (chunked
	// prefill, first come first served).
	PrefillBudget int
	// MaxRunning caps the sequences in the batch; the rest wait.
	MaxRunning int
	// DefaultMaxTokens is the output length when a request gives none.
	DefaultMaxTokens int
	// TimeScale runs the engine this many times faster than real time;
	// every duration the simulator reports is in real-scale units.
	TimeScale float64
	// Model is the name served at /v1/models.
	Model string
	// Served, when set, are the models the replica serves instead (a base
	// model and its LoRA adapters, as vLLM lists them), the first its
	// default; a request for any other gets vLLM's 404. Without it the
	// replica answers whatever model a request names.
	Served []string
	// TLS, when set, serves HTTPS with it, as vLLM does with
	// --ssl-certfile and --ssl-keyfile: URL is then https://.
	TLS *tls.Config
}

// DefaultConfig models a 30B-class model on one H100-class card.
//
// Calibration against the seed, measured through warmroute with
// `go test -run '^$' -bench . ./benchmarks/` (figures in the README):
//   - PrefillPerToken 90 us (about 11k tokens/s) and StepBase 20 ms make a
//     cold 90k-token prefill take about 8 s, and 8 cold 16k-token prompts
//     about 11.5 s, the seed's burst difference (30.1 s - 18.6 s).
//   - DecodePerSeq 0.3 ms and 300 output tokens make the burst's decode
//     tail about 7 s, the part of the seed's burst that spreading does not
//     shorten.
//   - KVCapacityTokens 240k holds two agent sessions of 100k tokens with
//     room to spare, but not four: round-robin makes each replica hold
//     every session, so it evicts, and its warm turns pay cold prefills.
func DefaultConfig() Config {
	return Config{
		BytesPerToken:    4,
		BlockTokens:      16,
		KVCapacityTokens: 240_000,
		StepBase:         20 * time.Millisecond,
		PrefillPerToken:  60 * time.Microsecond,
		PrefillAttention: 3240 * time.Nanosecond,
		DecodePerSeq:     300 * time.Microsecond,
		PrefillBudget:    8192,
		MaxRunning:       256,
		DefaultMaxTokens: 16,
		TimeScale:        1,
		Model:            "sim-30b",
	}
}
