// Command bareproxy is the least a fasthttp reverse proxy can be: requests
// go round-robin to the upstreams through fasthttp's own HostClient, the
// answer back as it came (streamed when it is SSE), with no routing, no
// header rules, no timeouts and no metrics. scripts/peers.sh measures it
// as "bare": what fasthttp itself costs, the floor of warmroute's design.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

var (
	listen    = flag.String("listen", "127.0.0.1:9080", "Address to serve on.")
	upstreams = flag.String("upstream", "127.0.0.1:9001,127.0.0.1:9002", "Comma-separated host:port of the upstreams.")
)

func main() {
	flag.Parse()
	var whole, streamed []*fasthttp.HostClient
	for _, addr := range strings.Split(*upstreams, ",") {
		// MaxConns: scripts/streams.sh holds up to 9000 streams open.
		whole = append(whole, &fasthttp.HostClient{Addr: addr, MaxConns: 16384})
		streamed = append(streamed, &fasthttp.HostClient{Addr: addr, MaxConns: 16384, StreamResponseBody: true})
	}
	var next atomic.Uint64
	streamKey := []byte(`"stream":true`)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		i := next.Add(1) % uint64(len(whole))
		c := whole[i]
		// loadgen's bodies say "stream" first: a search of the whole
		// body would be most of this proxy's own work.
		if body := ctx.PostBody(); bytes.Contains(body[:min(len(body), 64)], streamKey) {
			c = streamed[i]
		}
		if err := c.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	}, NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true}
	if err := srv.ListenAndServe(*listen); err != nil {
		fmt.Fprintln(os.Stderr, "bareproxy:", err)
		os.Exit(2)
	}
}
