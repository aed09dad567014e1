package tracing

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// How spans wait and go. The queue is what a collector that is down may
// cost in memory: a span with its attributes is about a KiB, so 4096 of
// them take a few MiB; past that, ended spans are dropped, never waited
// for. An export may take exportTimeout, retries included, while the
// queue fills behind it.
const (
	queueSize     = 4096
	batchSize     = 512
	batchDelay    = time.Second
	exportTimeout = 10 * time.Second
	sendTimeout   = 5 * time.Second // one POST to the collector
)

// scope names the spans' instrumentation scope: this package.
const scope = "github.com/warmroute/warmroute/tracing"

// Options are what New needs besides the endpoint.
type Options struct {
	// ServiceVersion is the resource's service.version, when not empty.
	ServiceVersion string
	// Logger gets the export failures and the count at Shutdown;
	// slog.Default() when nil.
	Logger *slog.Logger

	// queue, batch, export and send replace queueSize, batchSize,
	// exportTimeout and sendTimeout when not zero, so that a test can
	// fill the queue with a few spans and hold an export open.
	queue, batch int
	export, send time.Duration
}

// Tracer exports the spans of the requests that Start begins. It is safe
// for concurrent use. A nil *Tracer is tracing off.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	exporter *countingExporter
	log      *slog.Logger
	names    names
	server   trace.SpanStartOption // made once: boxing it costs an allocation

	// ended counts the sampled spans ended, each handed to the batch
	// processor; those neither exported nor failed were dropped.
	ended   atomic.Uint64
	stopped atomic.Bool
}

// New starts exporting to endpoint, an OTLP/HTTP URL (FlagUsage). An
// empty endpoint is tracing off: New returns a nil *Tracer and no error.
// A bad endpoint is an error, so that it fails at start; a collector
// that cannot be reached is not, since New sends nothing.
//
// Besides the endpoint, the SDK's own environment applies:
// OTEL_EXPORTER_OTLP_HEADERS (and _TRACES_HEADERS) for credentials,
// OTEL_EXPORTER_OTLP_CERTIFICATE for a private CA,
// OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_TRACES_SAMPLER (by default a span
// follows its parent's sampled flag and a root is always sampled), and
// the resource variables.
func New(endpoint string, opts Options) (*Tracer, error) {
	if endpoint == "" {
		return nil, nil
	}
	e, err := parseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// The resource's service.name, which OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override, as for any OpenTelemetry SDK.
	service := []attribute.KeyValue{semconv.ServiceName("warmroute")}
	if opts.ServiceVersion != "" {
		service = append(service, semconv.ServiceVersion(opts.ServiceVersion))
	}
	res, err := resource.New(context.Background(),
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(service...),
		resource.WithFromEnv(), // last, so that the environment wins
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}

	queue, batch := cmp.Or(opts.queue, queueSize), cmp.Or(opts.batch, batchSize)
	export, send := cmp.Or(opts.export, exportTimeout), cmp.Or(opts.send, sendTimeout)
	httpOpts := []otlptracehttp.Option{
		otlptracehttp.WithEndpoint(e.host),
		otlptracehttp.WithURLPath(e.path),
		otlptracehttp.WithTimeout(send),
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{
			Enabled:         true,
			InitialInterval: 500 * time.Millisecond,
			MaxInterval:     2 * time.Second,
			MaxElapsedTime:  export,
		}),
	}
	if !e.secure {
		httpOpts = append(httpOpts, otlptracehttp.WithInsecure())
	}
	exp, err := otlptracehttp.New(context.Background(), httpOpts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	counted := &countingExporter{SpanExporter: exp, log: log, endpoint: endpoint}

	// Without WithBlocking the processor drops a span that finds the
	// queue full: the request that ended it goes on.
	bsp := sdktrace.NewBatchSpanProcessor(counted,
		sdktrace.WithMaxQueueSize(queue),
		sdktrace.WithMaxExportBatchSize(batch),
		sdktrace.WithBatchTimeout(batchDelay),
		sdktrace.WithExportTimeout(export),
	)
	provider := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(bsp))
	return &Tracer{
		provider: provider,
		tracer:   provider.Tracer(scope),
		exporter: counted,
		log:      log,
		server:   trace.WithSpanKind(trace.SpanKindServer),
	}, nil
}

// Shutdown exports the spans still queued, waiting for that until ctx is
// done, and logs how many spans were exported and lost. Spans ended after
// it are dropped. Only the first call does anything, and none on a nil
// *Tracer.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil || t.stopped.Swap(true) {
		return nil
	}
	err := t.provider.Shutdown(ctx)
	exported, failed := t.exporter.exported.Load(), t.exporter.failed.Load()
	t.log.Info("tracing: stopped", "exported", exported, "failed", failed,
		"dropped", t.ended.Load()-exported-failed) // at a full queue, or left queued when ctx ended
	if err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}
