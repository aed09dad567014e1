// Package tracing exports one OpenTelemetry span per proxied request over
// OTLP/HTTP, with the official Go SDK.
//
// It is off unless an endpoint is given: New returns a nil *Tracer for an
// empty one, and the router holds that nil and checks it before each call,
// so that a request pays nothing for tracing it does not do. When on, a
// request's span is the child of the client's W3C traceparent (or a new
// root), its own traceparent goes to the replica, and its attributes say
// where the request went and why ([Attrs]).
//
// Export is asynchronous: ended spans go to a bounded queue that the SDK's
// batch span processor empties in the background, and a span that finds
// the queue full is dropped. A collector that is down, slow or hanging
// costs a request nothing but the span it loses.
package tracing
