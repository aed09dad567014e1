package tracing

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// tracesPath is where OTLP/HTTP receivers take spans; it is added to an
// endpoint given as a bare address (http://collector:4318), the way the
// collector's own examples write it.
const tracesPath = "/v1/traces"

// endpoint is a checked -otlp-endpoint: what the exporter needs to reach
// the receiver.
type endpoint struct {
	host   string // host:port, or host alone for the scheme's port
	path   string
	secure bool // https
}

// parseEndpoint checks the endpoint at start, so that a typo fails then
// rather than as export errors in the log an hour later. A URL the
// exporter would silently reshape is refused too: one with credentials
// (they would not be sent; OTEL_EXPORTER_OTLP_HEADERS carries them), a
// query or a fragment.
func parseEndpoint(s string) (endpoint, error) {
	bad := func(why string) (endpoint, error) {
		return endpoint{}, fmt.Errorf("OTLP endpoint %q: %s; want a URL such as http://otel-collector:4318 or https://otlp.example.com/v1/traces", s, why)
	}
	u, err := url.Parse(s)
	var e endpoint
	switch {
	case err != nil && !strings.Contains(s, "://"), err == nil && u.Opaque != "", err == nil && u.Scheme == "":
		return bad("no http:// or https://") // host:port parses as a scheme and an opaque part, or not at all
	case err != nil:
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return bad(err.Error())
	case u.Scheme == "https":
		e.secure = true
	case u.Scheme != "http":
		return bad(fmt.Sprintf("the scheme %q is neither http nor https", u.Scheme))
	}
	switch {
	case u.Hostname() == "":
		return bad("no host")
	case u.User != nil:
		return bad("credentials in the URL are not sent; set them as headers with OTEL_EXPORTER_OTLP_HEADERS")
	case u.RawQuery != "" || u.ForceQuery:
		return bad("a query is not sent")
	case u.Fragment != "":
		return bad("a fragment is not sent")
	}
	e.host, e.path = u.Host, u.EscapedPath()
	if e.path == "" || e.path == "/" {
		e.path = tracesPath
	}
	return e, nil
}
