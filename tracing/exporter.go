package tracing

import (
	"context"
	"log/slog"
	"sync/atomic"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// countingExporter stands between the batch span processor and the OTLP
// exporter. It counts what is sent and what fails, so that Shutdown can
// say what was lost, and it logs a failing collector once when it starts
// failing and once when it recovers: a collector down for an hour writes
// two lines, not one a batch. It hands no error back, because the
// processor would pass it to OpenTelemetry's global error handler, which
// writes past slog to the standard logger.
type countingExporter struct {
	sdktrace.SpanExporter
	log      *slog.Logger
	endpoint string

	exported, failed atomic.Uint64
	failing          atomic.Bool
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.failed.Add(uint64(len(spans)))
		if !e.failing.Swap(true) {
			e.log.Warn("tracing: export failed; each batch is lost until the collector takes one again",
				"endpoint", e.endpoint, "spans", len(spans), "err", err)
		}
		return nil
	}
	e.exported.Add(uint64(len(spans)))
	if e.failing.Swap(false) {
		e.log.Info("tracing: spans exported again", "endpoint", e.endpoint)
	}
	return nil
}
