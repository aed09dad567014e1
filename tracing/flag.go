package tracing

// FlagUsage is the usage text of warmroute's -otlp-endpoint flag, whose
// value goes to New. It lives here, beside what it describes, so that the
// flag is documented once.
const FlagUsage = "OTLP/HTTP endpoint to export one trace span per proxied request to: " +
	"http://otel-collector:4318 (a URL without a path gets /v1/traces) or https://host/path (the path as given). " +
	"The span is the child of the request's W3C traceparent, or a new trace's root, and the replica gets the span's own traceparent. " +
	"Spans are sent in batches in the background: a collector that is down or slow loses spans, and never delays or fails a request. " +
	"Empty turns tracing off (an incoming traceparent still reaches the replica unchanged)."
