package router

import (
	"context"
	"fmt"
	"log/slog"
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
