// Command fakeupstream is an OpenAI-shaped replica that answers at once: a
// fixed chat completion, or, for a body with "stream":true, an SSE answer of
// -chunks events, each written and flushed on its own. It measures a proxy's
// own cost (scripts/peers.sh); -chunk-interval makes slow streams for the
// many-streams test.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

var (
	listen   = flag.String("listen", "127.0.0.1:9001", "Address to serve on.")
	chunks   = flag.Int("chunks", 16, "Events in an SSE answer, before data: [DONE].")
	interval = flag.Duration("chunk-interval", 0, "Pause before each SSE event (0: none).")
	answer   = flag.Int("answer-bytes", 0, "Pad the non-streamed completion's content to about this many bytes (0: a short answer).")
	headNow  = flag.Bool("head-first", false, "Send an SSE answer's head at once, before the first event's pause, as vLLM's server does (by default it goes with the first event).")
)

var (
	completion = []byte(`{"id":"chatcmpl-fake","object":"chat.completion","created":1700000000,"model":"fake","choices":[{"index":0,"message":{"role":"assistant","content":"The answer is 42."},"finish_reason":"stop"}],"usage":{"prompt_tokens":512,"completion_tokens":6,"total_tokens":518}}`)
	event      = []byte("data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"fake\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"},\"finish_reason\":null}]}\n\n")
	done       = []byte("data: [DONE]\n\n")
	streamKey  = []byte(`"stream":true`)
)

// events is a pooled SSE body: one event per Read, so fasthttp writes and
// flushes each as its own chunk, as an engine streaming tokens does.
type events struct{ left int }

var eventPool = sync.Pool{New: func() any { return new(events) }}

func (e *events) Read(p []byte) (int, error) {
	switch {
	case e.left < 0:
		return 0, io.EOF
	case e.left == 0:
		e.left--
		return copy(p, done), nil
	}
	if *interval > 0 {
		time.Sleep(*interval)
	}
	e.left--
	return copy(p, event), nil
}

func (e *events) Close() error {
	eventPool.Put(e)
	return nil
}

func main() {
	flag.Parse()
	if pad := *answer - len(completion); pad > 0 {
		completion = bytes.Replace(completion, []byte("The answer is 42."), append([]byte("The answer is 42."), bytes.Repeat([]byte(" x"), pad/2)...), 1)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.PostBody(), streamKey) {
			ctx.SetContentType("text/event-stream")
			ev := eventPool.Get().(*events)
			ev.left = *chunks
			ctx.Response.ImmediateHeaderFlush = *headNow
			ctx.SetBodyStream(ev, -1)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(completion)
	}, MaxRequestBodySize: 64 << 20, Concurrency: 1 << 20}
	if err := srv.ListenAndServe(*listen); err != nil {
		fmt.Fprintln(os.Stderr, "fakeupstream:", err)
		os.Exit(2)
	}
}
