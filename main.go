// Command warmroute is an HTTP proxy for OpenAI-compatible inference
// replicas that sends each request where its prompt is already in the KV
// cache, and fails over, before a byte reaches the client, when a replica
// cannot be reached. Run it with -help for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/benchmarks/sim"
	"github.com/warmroute/warmroute/pinstore"
	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/router"
	"github.com/warmroute/warmroute/tracing"
	"github.com/warmroute/warmroute/upstream"
)

var (
	listen      = flag.String("listen", ":7770", "Address of the OpenAI-compatible front that clients talk to.")
	adminListen = flag.String("admin-listen", "127.0.0.1:7771", "Address of the admin listener: /metrics (Prometheus), /health, /replicas (JSON), and /debug/pprof/ with -pprof. Empty disables it.")
	withPprof   = flag.Bool("pprof", false, "Serve Go's profiles at /debug/pprof/ on the admin listener. They include heap and goroutine dumps: leave it off where the admin listener is reachable by others (a Prometheus scrape, say).")
	upstreams   = flag.String("upstream", "", "Comma-separated base URLs of the replicas (their root, without /v1), e.g. http://127.0.0.1:8001,http://127.0.0.1:8002; host:port alone means http://. Required unless -simulate is set.")
	upstreamDNS = flag.String("upstream-dns", "", "Find the replicas as the addresses of a DNS name, name:port (a Kubernetes headless Service: vllm.default.svc.cluster.local:8000), looked up every -dns-interval. Exclusive with -upstream.")
	upstreamSRV = flag.String("upstream-srv", "", "Find the replicas as the targets of an SRV name (_http._tcp.vllm.default.svc.cluster.local), looked up every -dns-interval. Exclusive with -upstream.")
	upstreamFil = flag.String("upstream-file", "", "Find the replicas in a file of base URLs, one a line (# comments), read again when it changes and on SIGHUP. Exclusive with -upstream.")
	dnsInterval = durationFlag("dns-interval", 5*time.Second, "Time between lookups of -upstream-dns and -upstream-srv. A replica that appears joins after its first good probe; one that disappears takes no new request and finishes the ones it has.")
	routing     = flag.String("routing", router.Default.String(), "Routing policy: cost (the default: the replica with the least estimated prefill ahead of the request's first token, the work queued there plus the part of its prompt that it does not hold; a conversation stays on its replica until waiting there costs more than prefilling it elsewhere), adaptive (continuations go to the replica that served their prefix, fresh requests are spread), affinity (every request pinned; a miss picks by the first message), or roundrobin.")
	placement   = flag.String("placement", "counter", "How a request that no pin places is spread: counter (in turn; exact, for one instance) or rendezvous (rendezvous hashing of its first message under a load bound, so that several instances in front of one fleet place a conversation alike and its next turn lands warm whichever instance gets it).")
	pinStoreURL = flag.String("pin-store", "", "Redis URL (redis://[user:pass@]host:port/db) where several instances share the pins that -placement rendezvous cannot compute: conversations moved off their placement, and Responses API ids. Written asynchronously, read on a local miss; off when empty.")
	pinStoreTO  = durationFlag("pin-store-timeout", 2*time.Millisecond, "Longest wait of a request for a pin store read; past it, or while the store is down, local pins only.")
	pinTTL      = durationFlag("pin-ttl", time.Hour, "Lifetime of a pin in the pin store; a conversation idle for longer is placed afresh.")
	simulate    = flag.Int("simulate", 0, "Start this many simulated vLLM-like replicas in-process on loopback and route to them (no GPU needed). 0 disables; -upstream is then required.")
	simScale    = flag.Float64("simulate-scale", 1, "Speed of the simulated replicas' clock against the wall clock (10 runs ten times faster); the durations they report stay in real-scale units.")
	pinCapacity = flag.Int("pin-capacity", 1<<18, fmt.Sprintf("Entries in the prefix pin map, one per served conversation turn; each takes %d bytes, so the default 262144 takes about 9 MiB. The least recently used entry goes first.", prefixcache.EntryBytes))
	maxBody     = sizeFlag("max-body-size", 64<<20, "Largest request body accepted, with a unit (64MiB, 512KiB, 1GB); past it the client gets a 413 with a JSON error.")
	bodyBudget  = sizeFlag("max-body-memory", defaultBodyBudget(), "Most bytes of request bodies over 64KiB held in memory at once, summed over all requests; past it a request gets 503 with Retry-After before its body is read. The default is a quarter of the memory this process may use (its cgroup limit, or the machine's), at most 4GiB. At least -max-body-size. Formerly -max-body-bytes.")
	bufferLimit = sizeFlag("buffer-limit", 1<<20, "Largest non-streamed response body read whole before it is written to the client; larger ones, and every SSE or chunked answer, are streamed as they arrive.")
	maxSends    = flag.Int("max-sends", 2, "Most replicas one request is sent to when the earlier ones could not take it: not reached (connection refused or timed out, request unread), or answered 503 or 429. A request that a replica may be running is never sent again.")
	connectTO   = durationFlag("connect-timeout", 2*time.Second, "Timeout of one connect to a replica. A replica that black-holes connections costs this once, then sits out its cooldown.")
	firstByteTO = durationFlag("first-byte-timeout", 10*time.Minute, "Longest wait for the first byte of a replica's answer: its queue and prefill, and the whole generation of a request that is not streamed. Past it a 504. A hung replica is found sooner by its probes (-health-timeout).")
	streamTO    = durationFlag("stream-idle-timeout", time.Minute, "Longest wait for each later byte of an answer under way (between two chunks of a stream); past it the stream is cut. With -stream-min-rate, also the window over which a stream's rate is measured.")
	streamRate  = flag.Int("stream-min-rate", 4, "Fewest bytes a second that a stream must keep up, measured over -stream-idle-timeout: a replica that sends fewer than this times -stream-idle-timeout bytes in that long (one trickling a byte a second) is cut as a silent one is. 0 turns the rule off.")
	responseTO  = durationFlagZero("response-timeout", 0, "Longest time one answer may take, from the request's send to its last byte, streams included: past it a 504, or a cut stream. 0, the default, bounds none: a long generation may take as long as it needs, each wait bounded by -first-byte-timeout and -stream-idle-timeout.")
	poolIdleTO  = durationFlag("upstream-keepalive-timeout", 4*time.Second, "How long an idle keep-alive connection to a replica is kept for reuse. Keep it below the replicas' own keep-alive timeout (5s in vLLM and SGLang), so that a replica never closes a connection just as a request goes out on it. Formerly -upstream-idle-timeout.")
	stallTO     = durationFlag("stall-timeout", 3*time.Second, "A replica with requests in flight that sends no byte on any of them for this long is probed at once; if that probe times out it is demoted as hung, and its waiting requests get 504.")
	writeTO     = durationFlag("client-write-timeout", time.Minute, "Longest time one write to a client may take: a whole answer, or one chunk of a stream (nginx's send_timeout). A client that stops reading is cut and its replica connection closed.")
	readTO      = durationFlag("client-read-timeout", time.Minute, "Longest time to read one request from a client, head and body; a slower client gets a 408.")
	idleTO      = durationFlag("client-idle-timeout", 90*time.Second, "How long a client's keep-alive connection may wait for its next request. Formerly -idle-timeout.")
	maxIdle     = flag.Int("max-idle-conns", 256, "Idle keep-alive connections kept to each replica.")
	healthPath  = flag.String("health-path", "/health", "Path probed with GET on each replica; a 2xx is healthy.")
	healthEvery = durationFlag("health-interval", 5*time.Second, "Time between probes of a live replica. A demoted replica is probed at the end of its cooldown instead.")
	healthTO    = durationFlag("health-timeout", 2*time.Second, "Timeout of one probe. A probe that times out is repeated at once; two in a row, or one while the replica sends nothing on its requests in flight, demote it as hung (vLLM answers /health while its GPU is busy).")
	scrapeEvery = durationFlagZero("scrape-interval", 0, "How often to read each live replica's own queue from its metrics page (vLLM's, SGLang's and llama.cpp's requests running and waiting, and KV cache use): shown in /replicas, and, under -routing cost, the requests that other callers queued there (another proxy, a client that bypasses this one) count in its cost. 0 reads none.")
	metricsPath = flag.String("replica-metrics-path", "/metrics", "Path of the replicas' Prometheus page, read every -scrape-interval.")
	cooldown    = durationFlag("cooldown", time.Second, "How long a demoted replica sits out before its first re-admission probe; doubled after each failed probe, up to -max-cooldown.")
	maxCooldown = durationFlag("max-cooldown", 30*time.Second, "Cap of the doubling cooldown.")
	drainDelay  = durationFlagZero("drain-delay", 5*time.Second, "On SIGTERM or SIGINT, how long both /health endpoints answer 503 while the proxy still accepts and serves, so that a load balancer or Kubernetes stops sending before it stops accepting. 0 stops accepting at once; a second signal ends the delay.")
	drainTO     = durationFlag("drain-timeout", 30*time.Second, "After -drain-delay, how long in-flight requests and streams may run on while no new connection is accepted; past it they are cut and the process exits.")
	promptChunk = sizeFlag("prompt-chunk", prefixcache.DefaultPromptChunk, "Bytes of a prompt's canonical rendering (its messages' roles and text, in order) between two links of its block chain: what each replica's cache is believed to hold is kept per link, so that a prompt sharing an earlier one's first N bytes, inside a message or across messages, is known to share all but the last chunk. vLLM caches 16-token blocks, about 64 bytes of text; from 64 to under 64KiB.")
	heldMemory  = sizeFlag("held-memory", router.DefaultHeldMemory, "Memory per replica for what its KV cache is believed to hold, about 40 bytes per link of -prompt-chunk bytes: the default holds about 105,000 links, 27MB of prompt, 6.7M tokens, four times the KV cache of a replica of 1.7M tokens (see -kv-capacity); a larger replica needs about 2.4MiB per million tokens of its cache for that. Allocated when a replica is first sent a prompt.")
	kvCapacity  = flag.Int64("kv-capacity", 0, "KV cache capacity of each replica, in tokens, for replicas whose engine publishes none (vLLM's cache_config_info, SGLang's max_total_num_tokens and llama.cpp's n_ctx times its slots are read when a replica joins and when it comes back). What a replica is believed to hold is bounded by four times it, least recently used first out. 0 bounds it by -held-memory alone.")
	sessionHdr  = flag.String("session-header", strings.Join(router.DefaultSessionHeaders, ","), "Comma-separated headers whose values name a request's session; the default lists those that Claude Code, Codex and OpenCode send (a subagent carries its session's and one of its own, and is a session of its own). A request without one is named by its body's prompt_cache_key (chat completions, Responses). Under -routing cost a session's replica counts as holding its prompt, so that a conversation whose history the agent compacted stays there unless that replica is down or busier by more than the prefill; under adaptive and affinity every request of a session goes to the replica that served its last. Empty turns header sessions off.")
	accessLog   = flag.Bool("access-log", false, "Log one INFO line per proxied request: client, method, path, model, replica, route, status, time to first byte, duration and bytes.")
	apiKeyFile  = flag.String("api-key-file", "", "File of API keys, one a line (# starts a comment): when set, a request without one of them, as Authorization: Bearer KEY or X-Api-Key: KEY, gets a 401 (GET /health excepted). Re-read on SIGHUP.")
	stripAuth   = flag.Bool("strip-authorization", false, "Keep the clients' Authorization and X-Api-Key headers from the replicas. By default they are passed on, so a replica started with its own --api-key still checks it.")
	forwardPath = listFlag("forward-path", "A path to forward to the replicas besides the inference API, which alone is forwarded by default (chat, completions, Responses, Messages, embeddings, models, tokenize, rerank, score, audio: docs/security.md lists each); any other path gets a 404. Matched whole, without the query: -forward-path /reset_prefix_cache admits vLLM's cache reset and nothing else. Repeat the flag or give a comma-separated list.")
	otlpURL     = flag.String("otlp-endpoint", "", tracing.FlagUsage)
	tlsCert     = flag.String("tls-cert-file", "", "PEM file of the front's certificate, followed by its chain, for HTTPS on -listen, with -tls-key-file; the front then takes HTTPS only. Read again when it or its key file changes (a handshake looks at most once a second) and on SIGHUP: new connections get the new certificate, open ones keep theirs. A pair that cannot be read, or a key that does not match, fails the start, and on a reload keeps the old certificate and is logged.")
	tlsKey      = flag.String("tls-key-file", "", "PEM file of the private key of -tls-cert-file.")
	adminCert   = flag.String("admin-tls-cert-file", "", "As -tls-cert-file, for the admin listener (-admin-listen), with -admin-tls-key-file; it may name the front's files.")
	adminKey    = flag.String("admin-tls-key-file", "", "PEM file of the private key of -admin-tls-cert-file.")
	upstreamCA  = flag.String("upstream-ca-file", "", "PEM file of the CA certificates that verify https:// replicas, in place of the system's roots. Replicas are https:// when their base URL says so (-upstream, -upstream-file), or with an https:// prefix on -upstream-dns or -upstream-srv.")
	upstreamSNI = flag.String("upstream-server-name", "", "Name that every https:// replica's certificate is verified against, and sent as SNI, in place of each replica's own host: for replicas reached by address (-upstream-dns finds pod IPs) whose certificate names a Service.")
	upstreamNoV = flag.Bool("upstream-insecure-skip-verify", false, "Do not verify the https:// replicas' certificates: the connections are encrypted, but anyone on the path can pose as a replica and read every prompt. Logged as a warning at start; for tests, never for production.")
	version     = flag.Bool("version", false, "Print the version, the commit it was built from and the Go version, and exit.")
	logFormat   = flag.String("log-format", "text", "Log format: text or json.")
	logLevel    = flag.String("log-level", "info", "Log level: debug, info, warn or error.")
)

func main() {
	flag.Usage = usage
	flag.Parse()
	if *version {
		fmt.Println(versionLine())
		return
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "warmroute: unexpected argument %q: every setting is a flag (-name value), and flags after it were not read; see -help\n", flag.Arg(0))
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "warmroute:", err)
		os.Exit(2)
	}
}

func run() error {
	if err := applyEnv(); err != nil {
		return err
	}
	log, err := newLogger(*logFormat, *logLevel)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	logRenamed(log)
	policy, err := router.ParsePolicy(*routing)
	if err != nil {
		return err
	}
	tracer, err := tracing.New(*otlpURL, tracing.Options{ServiceVersion: versionLine(), Logger: log})
	if err != nil {
		return fmt.Errorf("-otlp-endpoint: %w", err)
	}
	defer func() {
		// The spans of the last requests, sent before the process ends.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tracer.Shutdown(ctx)
	}()
	if err := checkFlags(); err != nil {
		return err
	}
	rendezvous := *placement == "rendezvous"
	tlsc, err := setupTLS(log)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	set, urls, disc, closeSim, err := startReplicas(ctx, log, tlsc)
	defer closeSim()
	if err != nil {
		return err
	}
	pins := prefixcache.NewPinMap(*pinCapacity, upstream.MaxReplicas)
	var store *pinstore.Store
	if *pinStoreURL != "" {
		if store, err = pinstore.Open(*pinStoreURL, pinstore.Options{Timeout: *pinStoreTO, TTL: *pinTTL, Logger: log}); err != nil {
			return fmt.Errorf("-pin-store: %w", err)
		}
		defer store.Close()
	}
	h := router.New(router.Config{Policy: policy, MaxSends: *maxSends, BufferLimit: int(*bufferLimit), StripAuthorization: *stripAuth, ForwardPaths: *forwardPath, AccessLog: *accessLog, SessionHeaders: splitList(*sessionHdr), PromptChunk: int(*promptChunk),
		HeldMemory: int64(*heldMemory), KVTokens: *kvCapacity, Rendezvous: rendezvous, PinStore: store, Tracer: tracer, Logger: log},
		set, pins, router.NewMetrics(set, pins))
	if *apiKeyFile != "" {
		keys, err := readKeys(*apiKeyFile)
		if err != nil {
			return err
		}
		h.SetKeys(keys)
	}
	// SIGHUP re-reads what lives in files: the API keys, the replicas and
	// the certificates.
	rediscover := make(chan struct{}, 1)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			tlsc.reload()
			if *apiKeyFile != "" {
				if keys, err := readKeys(*apiKeyFile); err != nil {
					log.Error("API keys not reloaded; the old ones stay", "err", err)
				} else {
					h.SetKeys(keys)
					log.Info("API keys reloaded", "keys", len(keys))
				}
			}
			select {
			case rediscover <- struct{}{}:
			default:
			}
		}
	}()
	scfg := router.ServerConfig{MaxBodySize: int(*maxBody), BodyBudget: int64(*bodyBudget), ReadTimeout: *readTO, WriteTimeout: *writeTO, IdleTimeout: *idleTO}
	srv := h.Server(scfg)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("cannot listen on -listen %s: %w", *listen, err)
	}
	var admin *http.Server
	if *adminListen != "" {
		aln, err := net.Listen("tcp", *adminListen)
		if err != nil {
			return fmt.Errorf("cannot listen on -admin-listen %s: %w", *adminListen, err)
		}
		admin = &http.Server{Handler: h.Admin(*withPprof), ReadHeaderTimeout: 10 * time.Second}
		go admin.Serve(listener(aln, tlsc.admin))
		*adminListen = aln.Addr().String()
	}
	set.Watch(ctx)
	if disc.Enabled() {
		set.Discover(ctx, disc, rediscover)
	}
	logStarted(log, ln.Addr().String(), urls)
	served := make(chan error, 1)
	// The bare-LF watch reads what TLS decrypted.
	go func() { served <- srv.Serve(router.Listener(listener(ln, tlsc.front))) }()
	storms, endStorms := context.WithCancel(context.Background())
	defer endStorms()
	go router.GiveBackMemory(storms, srv, time.Second, log)
	var sig os.Signal
	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case sig = <-sigs:
	}
	drain(log, h, srv, sigs, sig, stop)
	if admin != nil {
		admin.Close()
	}
	log.Info("stopped")
	return nil
}

// checkFlags checks the flags whose values depend on each other, or that
// their types do not bound.
func checkFlags() error {
	switch *placement {
	case "counter", "rendezvous":
	default:
		return fmt.Errorf("unknown -placement %q; valid: counter, rendezvous", *placement)
	}
	if *streamRate < 0 {
		return fmt.Errorf("-stream-min-rate is %d: want bytes a second, 0 or more (0 turns the rule off)", *streamRate)
	}
	if *pinCapacity < 1 || *maxSends < 1 || *maxIdle < 1 {
		return errors.New("-pin-capacity, -max-sends and -max-idle-conns must be at least 1")
	}
	if *promptChunk < 64 || *promptChunk >= 1<<16 || *heldMemory < 1<<16 || *kvCapacity < 0 {
		return errors.New("-prompt-chunk must be from 64 bytes to under 64KiB, -held-memory at least 64KiB, and -kv-capacity 0 or more")
	}
	if *bodyBudget < *maxBody {
		return fmt.Errorf("-max-body-memory %s is below -max-body-size %s: a body of the largest size could never be held", formatSize(int64(*bodyBudget)), formatSize(int64(*maxBody)))
	}
	return nil
}

// startReplicas starts the replica set from -upstream, discovery or
// -simulate, and returns it with the fixed list of base URLs (none for
// replicas found), the discovery, and what closes simulated replicas.
func startReplicas(ctx context.Context, log *slog.Logger, tlsc *tlsSetup) (set *upstream.Set, urls []string, disc *upstream.Discovery, closeSim func(), _ error) {
	urls = splitList(*upstreams)
	closeSim = func() {}
	disc = &upstream.Discovery{DNS: *upstreamDNS, SRV: *upstreamSRV, File: *upstreamFil, Interval: *dnsInterval}
	switch {
	case *simulate < 0 || *simScale <= 0:
		return nil, nil, nil, closeSim, errors.New("-simulate must be 0 or more and -simulate-scale above 0")
	case *simulate > 0 && (len(urls) > 0 || disc.Enabled()):
		return nil, nil, nil, closeSim, errors.New("-simulate, -upstream and -upstream-dns/-srv/-file are exclusive")
	case len(urls) > 0 && disc.Enabled():
		return nil, nil, nil, closeSim, errors.New("-upstream and -upstream-dns/-srv/-file are exclusive: a fixed list, or replicas found")
	case disc.Enabled():
	case *simulate > 0:
		cfg := sim.DefaultConfig()
		cfg.TimeScale = *simScale
		cluster, err := sim.StartCluster(*simulate, cfg)
		if err != nil {
			return nil, nil, nil, closeSim, err
		}
		closeSim = cluster.Close
		urls = cluster.URLs()
		log.Info("simulated replicas started", "replicas", strings.Join(urls, ","), "time_scale", *simScale)
	case len(urls) == 0:
		return nil, nil, nil, closeSim, errors.New("no replicas: set -upstream, or -upstream-dns, -upstream-srv or -upstream-file (or -simulate N for simulated ones)")
	}

	ucfg := upstream.Config{
		ConnectTimeout: *connectTO, FirstByteTimeout: *firstByteTO, StreamIdleTimeout: *streamTO, StreamMinRate: *streamRate, ResponseTimeout: *responseTO,
		IdleTimeout: *poolIdleTO, MaxIdleConns: *maxIdle, StallTimeout: *stallTO,
		HealthPath: *healthPath, HealthInterval: *healthEvery, HealthTimeout: *healthTO,
		Cooldown: *cooldown, MaxCooldown: *maxCooldown, Logger: log,
		ScrapeInterval: *scrapeEvery, MetricsPath: *metricsPath, TLS: tlsc.upstream,
	}
	var err error
	if disc.Enabled() {
		set, err = upstream.StartDiscovered(ctx, disc, ucfg)
	} else {
		set, err = upstream.NewSet(urls, ucfg)
	}
	return set, urls, disc, closeSim, err
}

// logStarted logs every setting, so that a log shows what the process ran
// with.
func logStarted(log *slog.Logger, front string, urls []string) {
	started := []any{"listen", front, "admin_listen", *adminListen, "upstream", strings.Join(urls, ","), "version", versionLine()}
	flag.VisitAll(func(f *flag.Flag) {
		switch f.Name {
		case "listen", "admin-listen", "upstream", "version":
		case "pin-store":
			started = append(started, "pin_store", redactURL(*pinStoreURL))
		default:
			if _, old := removedFlags[f.Name]; old || renamedFlags[f.Name] != "" {
				return
			}
			var v any = f.Value.String()
			if g, ok := f.Value.(flag.Getter); ok {
				v = g.Get()
			}
			started = append(started, strings.ReplaceAll(f.Name, "-", "_"), v)
		}
	})
	log.Info("warmroute started", started...)

}

// drain stops the process as a rolling deploy needs, after signal sig:
// /health says 503 at once, new connections are still accepted and
// served for -drain-delay (until the load balancer has taken this
// instance out), then no new ones (stop ends discovery and probes), and
// in-flight work gets -drain-timeout to finish.
func drain(log *slog.Logger, h *router.Handler, srv *fasthttp.Server, sigs <-chan os.Signal, sig os.Signal, stop func()) {
	h.Drain()
	log.Info("draining: /health answers 503; still serving for the drain delay", "signal", sig.String(), "drain_delay", *drainDelay)
	delay := time.NewTimer(*drainDelay)
	select {
	case <-delay.C:
	case sig = <-sigs:
		log.Info("second signal: the drain delay is cut short", "signal", sig.String())
	}
	log.Info("no longer accepting; waiting for requests in flight", "drain_timeout", *drainTO)
	stop()
	dctx, cancel := context.WithTimeout(context.Background(), *drainTO)
	defer cancel()
	if err := srv.ShutdownWithContext(dctx); err != nil {
		log.Warn("drain timed out; cutting the requests still in flight", "drain_timeout", *drainTO, "in_flight", h.Cut())
	}
}

// defaultBodyBudget is a quarter of the memory this process may use: its
// cgroup's limit (a container's), or else the machine's, at most 4 GiB;
// 1 GiB where neither can be read.
func defaultBodyBudget() int64 {
	limit := int64(0)
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		limit, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64) // "max" reads as 0
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil && limit == 0 {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			limit = kb << 10
		}
	}
	if limit <= 0 {
		return 1 << 30
	}
	return min(limit/4, 4<<30) &^ (1<<20 - 1) // whole MiB, so that it prints as such
}

// versionLine names the build: the module version (v1.2.3 when installed
// with go install, "(devel)" from a checkout), the VCS revision and time it
// was built from, and Go's version.
func versionLine() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "warmroute (no build information)"
	}
	s := "warmroute " + bi.Main.Version
	var rev, at, dirty string
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.time":
			at = kv.Value
		case "vcs.modified":
			if kv.Value == "true" {
				dirty = ", modified"
			}
		}
	}
	if rev != "" {
		s += " (" + rev[:min(12, len(rev))] + " " + at + dirty + ")"
	}
	return s + " " + bi.GoVersion
}

// readKeys reads an API key file: one key a line, blank lines and lines
// starting with # skipped. A file with no key is an error: it would lock
// every client out.
func readKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-api-key-file: %w", err)
	}
	var keys [][]byte
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			keys = append(keys, []byte(line))
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("-api-key-file %s holds no key (one a line)", path)
	}
	return keys, nil
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("invalid -log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("invalid -log-format %q: want text or json", format)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// duration is a duration flag that says how to write one (flag's own
// says only "parse error" for "-cooldown 5"); zero is refused unless the
// flag's off value is 0.
type duration struct {
	d       time.Duration
	zeroOff bool
}

// redactURL hides a URL's password for the log.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || raw == "" {
		return raw
	}
	return u.Redacted()
}
