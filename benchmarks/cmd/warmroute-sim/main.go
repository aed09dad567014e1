// Command warmroute-sim runs one simulated vLLM replica (benchmarks/sim) as
// its own process, so that scripts can kill and restart it. SIGTERM stops it
// gracefully: in-flight requests finish first.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/benchmarks/sim"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8001", "Address to serve the OpenAI-compatible API on.")
	scale := flag.Float64("scale", 1, "How many times faster than real time the engine runs.")
	kv := flag.Int("kv-tokens", sim.DefaultConfig().KVCapacityTokens, "KV cache capacity in tokens.")
	models := flag.String("model", "", "Comma-separated models to serve, the first the default (a base model, then LoRA adapters); a request for another gets a 404, as from vLLM. Empty: the default model, and any model a request names is answered.")
	flag.Parse()
	cfg := sim.DefaultConfig()
	cfg.TimeScale, cfg.KVCapacityTokens = *scale, *kv
	if *models != "" {
		cfg.Served = strings.Split(*models, ",")
	}
	r, err := sim.NewReplica(*listen, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "warmroute-sim:", err)
		os.Exit(2)
	}
	fmt.Fprintf(os.Stderr, "warmroute-sim: serving on %s\n", r.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.Shutdown(sctx)
}
