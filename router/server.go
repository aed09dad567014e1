package router

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/valyala/fasthttp"
)

// ServerConfig is the client-facing side of the command line.
type ServerConfig struct {
	// MaxBodySize is the largest request body accepted; past it a 413.
	MaxBodySize int
	// ReadTimeout bounds reading one request, head and body, so that a
	// slow or stalled client holds a connection for no longer.
	ReadTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection's wait for its next request.
	IdleTimeout time.Duration
	// BodyBudget bounds the large request bodies held in memory at once,
	// summed (see bodyBudget); 0 turns it off.
	BodyBudget int64
	// WriteTimeout bounds each write to a client: a whole answer that is
	// not streamed, or one chunk of a stream (default 60s, nginx's
	// send_timeout). A client that stops reading is cut, and its replica
	// connection closed, so that it holds neither for longer.
	WriteTimeout time.Duration
}

// Server returns the fasthttp server for h. Responses carry the replica's
// own Server, Date and Content-Type headers, so fasthttp adds none.
func (h *Handler) Server(cfg ServerConfig) *fasthttp.Server {
	cfg.WriteTimeout = cfg.writeTimeout()
	h.writeTimeout = cfg.WriteTimeout
	var headerReceived func(*fasthttp.RequestHeader) fasthttp.RequestConfig
	if cfg.BodyBudget > 0 {
		h.budget = newBodyBudget(cfg.BodyBudget, int64(cfg.MaxBodySize), max(cfg.ReadTimeout, time.Second))
		headerReceived = h.budget.headerReceived
		h.m.watchBudget(h.budget)
	}
	srv := &fasthttp.Server{
		Handler:                      h.Serve,
		ErrorHandler:                 h.errorHandler,
		ExpectHandler:                h.expect(cfg.MaxBodySize),
		HeaderReceived:               headerReceived,
		ConnState:                    connState, // bare-LF heads (listener.go)
		MaxRequestBodySize:           cfg.MaxBodySize,
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		// Each open connection has a worker goroutine; the idle ones go
		// within two of these periods, each holding the stack that
		// serving grew.
		MaxIdleWorkerDuration: time.Second,
		ReadBufferSize:        8 << 10, // also the longest request head
		Logger:                debugLogger{h.log},
	}
	return srv
}

// writeTimeout is WriteTimeout with its default.
func (cfg ServerConfig) writeTimeout() time.Duration {
	if cfg.WriteTimeout <= 0 {
		return time.Minute
	}
	return cfg.WriteTimeout
}

// debugLogger takes fasthttp's per-connection errors (a client that left, a
// stream the proxy cut on purpose) down to DEBUG: the proxy logs what an
// operator needs itself.
type debugLogger struct{ log *slog.Logger }

func (l debugLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...))
	}
}

// GiveBackMemory returns to the system the memory that a storm of client
// connections left behind, until ctx ends. Each connection holds read and
// write buffers, a request context and a goroutine's stack; when they
// close, these sit in fasthttp's pools and the runtime's free lists until
// a collection, and a proxy that allocates nothing per request may go
// minutes without one: 3,000 slow connections and 100 slow streams left
// the resident memory at 80 MB, against 15 MB before, 20 s after they had
// closed. So every tick (a second in main) the open connections are
// counted, and once they fell to half their peak (of at least stormConns)
// since the last look back, and stayed there for stormCalm, the heap is
// collected twice (a pooled object outlives one collection) and its free
// pages go back to the system, at most once per stormGap. Under steady
// load nothing is done. Each give-back is logged at INFO.
func GiveBackMemory(ctx context.Context, srv *fasthttp.Server, tick time.Duration, log *slog.Logger) {
	t := time.NewTicker(tick)
	defer t.Stop()
	peak, calm, last := 0, time.Time{}, time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			open := int(srv.GetOpenConnectionsCount())
			if open >= stormConns && peak < stormConns {
				log.Debug("connection storm", "open", open)
			}
			peak = max(peak, open)
			if peak < stormConns || open > peak/2 {
				calm = time.Time{}
				continue
			}
			if calm.IsZero() {
				calm = now
			}
			// The server's idle workers, each with its stack, go within
			// two of its MaxIdleWorkerDuration (1 s) after their
			// connections: their memory can be given back after that.
			if now.Sub(calm) >= stormCalm && now.Sub(last) >= stormGap {
				runtime.GC()
				debug.FreeOSMemory()
				log.Info("memory given back after a connection storm", "peak_connections", peak, "open", open)
				peak, calm, last = open, time.Time{}, now
			}
		}
	}
}

// stormConns is the fewest open connections that count as a storm,
// stormCalm how long they must have stayed at half their peak, and
// stormGap the shortest time between two give-backs: each costs two
// collections of the heap, a few milliseconds for the proxy's.
const (
	stormConns = 64
	stormCalm  = 3 * time.Second
	stormGap   = 10 * time.Second
)
