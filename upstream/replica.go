// Package upstream holds the replicas behind the proxy: their connections,
// their health, and the rule for when a request may be sent a second time.
package upstream

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MaxReplicas bounds the replica table, so that a set of replicas is a
// Mask of a few words on the request path.
const MaxReplicas = 256

// Config is what the replicas share. Zero durations are replaced by the
// defaults documented on each field.
type Config struct {
	// ConnectTimeout bounds one dial to a replica (default 2s). A replica
	// that black-holes connections costs this once, then sits out its
	// cooldown.
	ConnectTimeout time.Duration
	// FirstByteTimeout bounds the wait for the first byte of an answer
	// (default 10m). It covers the queue and the prefill, and, for a
	// request that is not streamed, the whole generation: an 8k-token
	// answer at 20 tokens a second behind a deep queue takes minutes. A
	// replica that hangs is found by its probes instead (HealthTimeout).
	FirstByteTimeout time.Duration
	// StreamIdleTimeout bounds every later wait for a byte of an answer
	// under way: between two chunks of a stream, or the rest of a head or
	// body (default 1m). An engine streams a token every few tens of
	// milliseconds; a minute of silence mid-answer is a wedged engine.
	StreamIdleTimeout time.Duration
	// StreamMinRate is the fewest bytes a second that a stream must keep
	// up, measured over StreamIdleTimeout: a replica that sends fewer
	// than StreamMinRate × StreamIdleTimeout bytes in that long is cut as
	// one silent for it is. 0 keeps StreamIdleTimeout alone, which a
	// replica trickling a byte a second never trips.
	StreamMinRate int
	// ResponseTimeout bounds the whole of one answer, from the request's
	// send to the answer's last byte, streams included; 0 (the default)
	// bounds none.
	ResponseTimeout time.Duration
	// IdleTimeout is how long a pooled connection may sit idle and still
	// be used (default 4s): below the 5 s keep-alive timeout of vLLM and
	// SGLang (uvicorn), so that the replica almost never closes a
	// connection just as a request goes out on it, the one case where the
	// proxy cannot tell whether the replica read the request.
	IdleTimeout time.Duration
	// MaxIdleConns is how many idle keep-alive connections each replica
	// keeps (default 256).
	MaxIdleConns int
	// TrustIdle is how long a pooled connection may sit idle and still be
	// used without first peeking at it; the default, 0, peeks at every
	// reuse. The peek, a recvfrom, finds a connection that the replica
	// closed, and bytes that it sent after a whole answer, which would
	// otherwise be read as the next request's answer. A connection that
	// the replica closes after the peek, as the request goes out, is
	// found when its request fails unread (a reset, or an end of stream
	// with the request unacknowledged), and the request is resent on a
	// fresh connection to the same replica
	// (TestStaleKeepAliveIsResentOnAFreshConnection, which sets it long).
	TrustIdle time.Duration
	// HealthPath is probed with GET (default /health).
	HealthPath string
	// HealthInterval is the time between probes of a live replica
	// (default 5s).
	HealthInterval time.Duration
	// HealthTimeout bounds one probe (default 2s). vLLM's and SGLang's
	// /health is answered by their API server, which keeps answering while
	// the GPU is busy (in milliseconds, or a few hundred under a heavy
	// load of streams), so a probe that times out is a fault: see watch.
	HealthTimeout time.Duration
	// StallTimeout is how long a replica with requests in flight may send
	// no byte on any of them before it is probed at once, out of turn
	// (default 3s: an engine streams a token every few tens of
	// milliseconds); see watch.
	StallTimeout time.Duration
	// Cooldown is how long a demoted replica sits out before its first
	// re-admission probe (default 1s); each failed probe doubles it, up to
	// MaxCooldown (default 30s). MaxCooldown also caps how long a
	// Retry-After keeps a replica that answered 503 or 429 skipped.
	Cooldown, MaxCooldown time.Duration
	// ScrapeInterval is how often each live replica's own queue is read
	// from its metrics page (MetricsPath; Report); 0, the default, reads
	// none.
	ScrapeInterval time.Duration
	// MetricsPath is the replicas' Prometheus page (default /metrics).
	MetricsPath string
	// TLS is the client side of the connections to https:// replicas, the
	// proxy's requests and its probes, scrapes and reads alike: the roots
	// that verify them, and the name that they are verified against and
	// sent as SNI. nil verifies against the system's roots and each
	// replica's own host. Each replica gets its own copy (tls.go).
	TLS *tls.Config
	// Logger receives demotion, re-admission and failover lines.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.ConnectTimeout, 2*time.Second)
	def(&c.FirstByteTimeout, 10*time.Minute)
	def(&c.StreamIdleTimeout, time.Minute)
	def(&c.IdleTimeout, 4*time.Second)
	def(&c.HealthInterval, 5*time.Second)
	def(&c.HealthTimeout, 2*time.Second)
	def(&c.StallTimeout, 3*time.Second)
	def(&c.Cooldown, time.Second)
	def(&c.MaxCooldown, 30*time.Second)
	if c.MaxIdleConns <= 0 {
		c.MaxIdleConns = 256
	}
	if c.HealthPath == "" {
		c.HealthPath = "/health"
	}
	if c.MetricsPath == "" {
		c.MetricsPath = "/metrics"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Replica states.
const (
	// Live: in rotation.
	Live int32 = iota
	// Down: demoted; probed at the end of its cooldown.
	Down
	// Joining: discovered, not yet probed; it joins after a good probe.
	Joining
	// Removed: gone from the set; its requests in flight finish.
	Removed
)

// StateNames are the states as /replicas shows them, in order.
var StateNames = [...]string{"live", "down", "joining", "removed"}

// Replica is one inference server. Its counters are atomics read by the
// router and the metrics; it must not be copied.
type Replica struct {
	_ noCopy

	Index int
	// Name is the replica's host:port, used in headers, logs and labels.
	Name string
	// NameBytes is Name for response headers, made once.
	NameBytes []byte
	// URL is the base URL, http://host:port or https://host:port.
	URL string
	// ID is a hash of Name: the same replica has the same ID in every
	// warmroute instance, so rendezvous placement agrees across them.
	ID uint64

	addr string
	host []byte      // Host header value
	tls  *tls.Config // nil for an http:// replica

	state     atomic.Int32
	hung      atomic.Bool  // demoted because it stopped answering; waits on it end
	cooldown  atomic.Int64 // nanoseconds; the current cooldown while Down
	retryAt   atomic.Int64 // unix nanoseconds of the next probe while Down
	skipUntil atomic.Int64 // unix nanoseconds until which a replica that answered 503 or 429 is skipped
	inflight  atomic.Int64
	waiting   atomic.Int64  // requests sent that have had no response byte yet
	queued    atomic.Int64  // the prefill bytes that those requests still need, as the router estimated them
	streams   atomic.Int64  // requests whose answer is being streamed to the client
	progress  atomic.Uint64 // counts waits that a byte from the replica ended
	demotions atomic.Uint64
	requests  atomic.Uint64
	stopWatch context.CancelFunc // ends the watcher when r leaves the set
	released  atomic.Bool        // its slot was given back
	// afterStreams is what the replica does with a connection after a
	// streamed answer that did not say it would close it: streamsUnknown,
	// streamsKept or streamsClosed (llama.cpp's llama-server closes it).
	// Until it is known, such a connection is not reused (Release).
	// probing is set while one of them is watched (probeAfterStream).
	afterStreams atomic.Int32
	probing      atomic.Bool
	probed       func() // a test's hook, called after each probe

	// FailoverLog, FailLog and CutLog throttle the WARN lines about the
	// replica: failovers, answers it failed to give, streams it cut.
	FailoverLog, FailLog, CutLog Throttle
	wake                         chan struct{} // Demote tells the watcher to probe at the end of the cooldown

	served   atomic.Pointer[servedModels] // nil: serves every model
	report   atomic.Pointer[Report]       // its last scrape; nil: none yet
	kvTokens atomic.Int64                 // its KV capacity in tokens (capacity.go); 0: unknown

	set  *Set
	mu   sync.Mutex
	idle []*Conn
}

// Host returns the Host header value for requests to the replica.
func (r *Replica) Host() []byte { return r.host }

// State returns Live or Down.
func (r *Replica) State() int32 { return r.state.Load() }

// Serving reports whether the replica is live: not demoted, joining or
// removed.
func (r *Replica) Serving() bool { return r.state.Load() == Live }

// InFlight returns the requests that hold a connection to the replica now.
func (r *Replica) InFlight() int64 { return r.inflight.Load() }

// Requests returns how many requests were sent to the replica.
func (r *Replica) Requests() uint64 { return r.requests.Load() }

// Demotions returns how many times the replica was demoted.
func (r *Replica) Demotions() uint64 { return r.demotions.Load() }

// Waiting returns how many requests sent to the replica have had no
// response byte yet, and the prefill work (prompt bytes not cached there,
// as the router estimated them) that they hold: the queue in front of a
// new request's first token, as the proxy sees it without asking.
func (r *Replica) Waiting() (requests, bytes int64) {
	return r.waiting.Load(), r.queued.Load()
}

// What a replica does with a connection after a streamed answer.
const (
	streamsUnknown int32 = iota
	streamsKept
	streamsClosed
)

// streamProbe is how long after a replica's first streamed answer its
// connection is looked at (probeAfterStream): far longer than a replica
// that closes it takes to, even on a loaded host.
const streamProbe = 100 * time.Millisecond

// closedAfterStream records that r closed a connection after a streamed
// answer, and logs it the first time.
func (r *Replica) closedAfterStream() {
	if r.afterStreams.Swap(streamsClosed) != streamsClosed {
		r.set.cfg.Logger.Info("replica closes its connection after a streamed answer; those connections are not reused", "replica", r.Name)
	}
}

// probeAfterStream learns whether r keeps a connection open after a
// streamed answer, from c, which just carried one. A replica that closes
// it may first read a request sent on it, and drop it: llama-server
// does, in the instant between its stream's last bytes and its close, and
// no sign on the socket tells that from a replica that read the request
// and failed while running it. So no such connection is reused before
// one has been seen open well after its stream; c is closed after it was
// looked at, and while one is watched, the others are closed at once.
func (r *Replica) probeAfterStream(c *Conn) {
	if !r.probing.CompareAndSwap(false, true) {
		c.closeSocket()
		return
	}
	// A replica demoted meanwhile may come back as another engine, to be
	// learnt again (readmit): c tells nothing of it.
	demotions := r.demotions.Load()
	time.AfterFunc(streamProbe, func() {
		switch {
		case r.demotions.Load() != demotions:
		case c.alive():
			r.afterStreams.CompareAndSwap(streamsUnknown, streamsKept)
		default:
			r.closedAfterStream()
		}
		c.closeSocket()
		r.probing.Store(false)
		if r.probed != nil {
			r.probed()
		}
	})
}

// KeepsStreamConns reports whether r was seen keeping a connection open
// after a streamed answer, so that such connections are reused.
func (r *Replica) KeepsStreamConns() bool { return r.afterStreams.Load() == streamsKept }

// Cooldown returns the current cooldown of a demoted replica, or 0.
func (r *Replica) Cooldown() time.Duration {
	if r.state.Load() == Live {
		return 0
	}
	return time.Duration(r.cooldown.Load())
}

// ParseBaseURL checks one replica's base URL and returns it as
// http://host:port or https://host:port, with host:port. A base URL is the
// replica's root, so that requests keep their own paths: a path such as
// /v1 would be prepended to every request and turn each into a 404 while
// the replica looks healthy, so it is refused, and so are a missing port
// (no guess of 80 or 443 for a GPU server) and any scheme but http and
// https.
func ParseBaseURL(raw string) (string, string, error) {
	want := "want http://host:port or https://host:port, the replica's root, e.g. http://127.0.0.1:8001"
	if raw != strings.TrimSpace(raw) || strings.ContainsAny(raw, " \t\n\r") {
		return "", "", fmt.Errorf("upstream %q contains a space: separate base URLs with commas; %s", raw, want)
	}
	full := raw
	if !strings.Contains(raw, "://") {
		full = "http://" + raw // host:port alone means plain HTTP
	}
	u, err := url.Parse(full)
	switch {
	case err != nil || u.Host == "" || u.User != nil:
		return "", "", fmt.Errorf("cannot parse upstream %q: %s", raw, want)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", "", fmt.Errorf("upstream %q: scheme %q is not supported; use http:// or https://", raw, u.Scheme)
	case u.Path != "" && u.Path != "/":
		return "", "", fmt.Errorf("upstream %q has a path (%s): %s; requests keep their own paths such as /v1/chat/completions", raw, u.Path, want)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return "", "", fmt.Errorf("upstream %q has a query or fragment: %s", raw, want)
	case u.Port() == "":
		return "", "", fmt.Errorf("upstream %q has no port: %s", raw, want)
	case u.Hostname() == "":
		return "", "", fmt.Errorf("upstream %q has no host: %s", raw, want)
	}
	if port, err := strconv.Atoi(u.Port()); err != nil || port < 1 || port > 65535 {
		return "", "", fmt.Errorf("upstream %q: port %q is not a number from 1 to 65535", raw, u.Port())
	}
	addr := net.JoinHostPort(u.Hostname(), u.Port())
	return u.Scheme + "://" + addr, addr, nil
}

// Skip leaves r out of new picks for d from now, capped at MaxCooldown:
// it answered 503 or 429 with that Retry-After.
func (r *Replica) Skip(d time.Duration, now time.Time) {
	r.skipUntil.Store(now.Add(min(d, r.set.cfg.MaxCooldown)).UnixNano())
}

// Demote takes r out of rotation at once, because a request could not reach
// it. Exactly one caller wins the compare-and-swap; it logs the demotion and
// wakes the watcher, which probes at the end of the cooldown. It reports
// whether this call demoted r.
func (r *Replica) Demote(cause error, now time.Time) bool {
	return r.demote(cause, now, false)
}

// demote is Demote; hung also ends every wait for a byte from r (they are
// answered 504, never sent again: r may be running them).
func (r *Replica) demote(cause error, now time.Time, hung bool) bool {
	if !r.state.CompareAndSwap(Live, Down) {
		return false
	}
	r.set.refreshLive()
	r.hung.Store(hung)
	r.demotions.Add(1)
	cd := r.set.cfg.Cooldown
	r.cooldown.Store(int64(cd))
	r.retryAt.Store(now.Add(cd).UnixNano())
	r.DropIdle()
	msg := "replica demoted"
	if hung {
		msg = "replica demoted as hung; requests waiting on it get 504"
	}
	r.set.cfg.Logger.Info(msg, "replica", r.Name, "cause", errText(cause), "cooldown", cd)
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return true
}

func (r *Replica) readmit() {
	switch {
	case r.state.CompareAndSwap(Down, Live):
		r.hung.Store(false)
		// It may have come back as another engine.
		r.afterStreams.Store(streamsUnknown)
		r.report.Store(nil) // the queue it had before it went down is gone
		r.set.refreshLive()
		r.set.cfg.Logger.Info("replica readmitted", "replica", r.Name)
	case r.state.CompareAndSwap(Joining, Live):
		r.set.refreshLive()
		r.set.cfg.Logger.Info("replica joined", "replica", r.Name)
	}
}

// Throttle lets one log line a second through and counts the rest.
type Throttle struct {
	last atomic.Int64 // unix nanoseconds of the last line let through
	held atomic.Int64 // lines held back since then
}

// Allow reports whether a line may be written now, and how many were held
// back since the last one.
func (t *Throttle) Allow(now time.Time) (bool, int64) {
	last := t.last.Load()
	if now.UnixNano()-last < int64(time.Second) || !t.last.CompareAndSwap(last, now.UnixNano()) {
		t.held.Add(1)
		return false, 0
	}
	return true, t.held.Swap(0)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// noCopy makes go vet report copies of types that embed it.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}
