package router

import (
	"bytes"
	"context"
	"log/slog"
	"time"
)

// logAccess writes the access log line of x's request (-access-log), which
// was answered with status, its body of n bytes. It runs only when the log
// is on: the request path pays nothing for it otherwise.
func (x *exchange) logAccess(status int, n int64, replica string, end time.Time) {
	var ttfb time.Duration
	if !x.firstByte.IsZero() {
		ttfb = x.firstByte.Sub(x.start)
	}
	client, method, path := x.ctx.RemoteAddr(), x.ctx.Method(), x.ctx.Path()
	x.h.log.LogAttrs(context.Background(), slog.LevelInfo, "request",
		slog.String("client", client.String()),
		slog.String("method", string(method)),
		slog.String("path", string(path)),
		slog.String("model", string(x.modelName)),
		slog.String("replica", replica),
		slog.String("route", x.reason.String()),
		slog.Int("status", status),
		slog.Duration("ttfb", ttfb),
		slog.Duration("duration", end.Sub(x.start)),
		slog.Int64("bytes", n),
	)
}

// record counts an answer given by replica (-1: none) in the metrics,
// and writes its access log line when the log is on.
func (x *exchange) record(replica, class, status int, n int64, name string, now time.Time) {
	x.h.m.request(replica, x.reason, class)
	x.h.m.total.Update(now.Sub(x.start).Seconds())
	if x.h.cfg.AccessLog {
		x.logAccess(status, n, name, now)
	}
	if x.h.cfg.Tracer != nil {
		x.endSpan(name, status, now)
	}
}

var strModelKey = []byte(`"model"`)

// modelOf returns the value of a request body's "model" string as written,
// or nothing (see stringOf).
func modelOf(body []byte) []byte { return stringOf(body, strModelKey) }

// stringOf returns the value of the first member named key (quoted) in a
// JSON body, when it is a plain string with no escape, or nothing. It looks
// only for the key: for a log line, or for a key that appears once at the
// top of its body (a Responses id), not for parsing in general.
func stringOf(body, key []byte) []byte {
	i := bytes.Index(body, key)
	if i < 0 {
		return nil
	}
	rest := bytes.TrimLeft(body[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '"' {
		return nil
	}
	if j := bytes.IndexAny(rest[1:], "\"\\"); j >= 0 && rest[1+j] == '"' {
		return rest[1 : 1+j]
	}
	return nil
}
