package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// Watch probes every replica until ctx ends: a live replica every
// HealthInterval, a demoted one at the end of its cooldown, a joining one at
// once. It starts one goroutine per replica, and one for each replica that
// joins later, and returns at once.
func (s *Set) Watch(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchCtx = ctx
	s.client = &http.Client{
		Timeout: s.cfg.HealthTimeout,
		Transport: &http.Transport{
			DialContext:       (&net.Dialer{Timeout: s.cfg.ConnectTimeout}).DialContext,
			DisableKeepAlives: true, // a probe must prove that a new connection works
			// An https:// replica's certificate is verified as the
			// requests' is: one that fails demotes the replica.
			TLSClientConfig:     s.cfg.TLS,
			TLSHandshakeTimeout: s.cfg.ConnectTimeout,
		},
	}
	if s.cfg.ScrapeInterval > 0 {
		// Scrapes are frequent: they keep their connections.
		s.scrapeClient = &http.Client{
			// vLLM renders its page in Python, in tens of
			// milliseconds, more under load: as long as a probe.
			Timeout: s.cfg.HealthTimeout,
			Transport: &http.Transport{
				DialContext:         (&net.Dialer{Timeout: s.cfg.ConnectTimeout}).DialContext,
				TLSClientConfig:     s.cfg.TLS,
				TLSHandshakeTimeout: s.cfg.ConnectTimeout,
				MaxIdleConnsPerHost: 1,
				// Below the replicas' keep-alive timeout, as for
				// requests; and a replica that leaves keeps none.
				IdleConnTimeout: s.cfg.IdleTimeout,
			},
		}
	}
	for i := range s.slots {
		if r := s.slots[i].Load(); r != nil && r.state.Load() != Removed {
			s.startWatch(r)
		}
	}
}

// startWatch starts r's watcher, which ends with the set's context or when
// r is removed. s.mu is held.
func (s *Set) startWatch(r *Replica) {
	ctx, cancel := context.WithCancel(s.watchCtx)
	r.stopWatch = cancel
	client := s.client
	go func() {
		r.fetchModels(ctx, client)
		r.fetchCapacity(ctx, client)
		r.watch(ctx, client)
	}()
	if s.scrapeClient != nil {
		go r.scrapeLoop(ctx, s.scrapeClient)
	}
}

// hungAfter is how many probes in a row must time out before a replica
// that shows no other sign of life is demoted as hung. One timeout can be a
// pause (a collection, an event loop busy tokenizing a huge prompt); two
// back to back, 2 x HealthTimeout of silence, is a wedged process. A
// replica that also sent no byte on the answers it was streaming during
// the probe needs only one: its data path confirms what the probe saw.
const hungAfter = 2

// watch probes r until ctx ends: every HealthInterval while it is live, at
// the end of its cooldown while it is down, at once when its requests in
// flight have had no byte for StallTimeout; and closes pooled connections
// that outlived IdleTimeout. A probe refused or answered non-2xx demotes
// r. One that times out is repeated at once; hungAfter in a row, or one
// while r sent no byte on the answers it streams, demote it as hung, and
// its waiting requests get 504 at once. So a replica stopped (kill -STOP)
// under streaming load takes no new request within StallTimeout +
// HealthTimeout (about 5 s by default), and within HealthInterval + 2 x
// HealthTimeout (9 s) otherwise; it is back after its first good probe.
func (r *Replica) watch(ctx context.Context, client *http.Client) {
	cfg := &r.set.cfg
	first := cfg.HealthInterval
	if r.state.Load() == Joining {
		first = 0 // it joins after a good probe: probe at once
	}
	timer := time.NewTimer(first)
	defer timer.Stop()
	tick := time.NewTicker(max(cfg.StallTimeout/4, 10*time.Millisecond))
	defer tick.Stop()
	var seen uint64     // progress at the last tick
	quiet := time.Now() // since when r has had work in flight and sent nothing
	timeouts := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
			// Demoted: probe at the end of the cooldown, not on the tick.
			timeouts = 0
			timer.Reset(time.Until(time.Unix(0, r.retryAt.Load())))
			continue
		case now := <-tick.C:
			r.closeExpired(now)
			if p := r.progress.Load(); p != seen || r.inflight.Load() == 0 || r.state.Load() != Live {
				seen, quiet = p, now
				continue
			}
			if now.Sub(quiet) < cfg.StallTimeout {
				continue
			}
			quiet = now // one probe out of turn per StallTimeout of silence
			cfg.Logger.Debug("replica stalled; probing it now", "replica", r.Name, "in_flight", r.inflight.Load())
		case <-timer.C:
		}
		streaming := r.streams.Load() > 0
		before := r.progress.Load()
		err := r.Probe(ctx, client)
		if ctx.Err() != nil {
			return
		}
		next := cfg.HealthInterval
		switch {
		case r.state.Load() == Joining && err != nil:
			cfg.Logger.Debug("joining replica not ready", "replica", r.Name, "cause", errText(err))
			next = cfg.Cooldown
		case (r.state.Load() == Down || r.state.Load() == Joining) && err == nil:
			timeouts = 0
			r.fetchModels(ctx, client)
			r.fetchCapacity(ctx, client)
			r.readmit()
		case r.state.Load() == Down:
			cd := min(2*time.Duration(r.cooldown.Load()), cfg.MaxCooldown)
			r.cooldown.Store(int64(cd))
			r.retryAt.Store(time.Now().Add(cd).UnixNano())
			cfg.Logger.Debug("replica still down", "replica", r.Name, "cause", errText(err), "cooldown", cd)
			next = cd
		case err == nil:
			timeouts = 0
			r.fetchModels(ctx, client)
		case probeTimedOut(err):
			timeouts++
			// Only a streamed answer owes bytes all along: one that is
			// not streamed is silent until it is done.
			silent := streaming && r.streams.Load() > 0 && r.progress.Load() == before
			if timeouts < hungAfter && !silent {
				cfg.Logger.Debug("replica probe timed out; probing again", "replica", r.Name)
				next = time.Millisecond
				break
			}
			timeouts = 0
			if r.demote(err, time.Now(), true) {
				next = r.demoted()
			}
		default:
			if r.Demote(err, time.Now()) {
				next = r.demoted()
			}
		}
		timer.Reset(next)
	}
}

// demoted drains the wake-up that a demotion by the watcher itself sent and
// returns when to probe next.
func (r *Replica) demoted() time.Duration {
	select {
	case <-r.wake:
	default:
	}
	return r.set.cfg.Cooldown
}

// ProbeUserAgent names the proxy's own requests to a replica, its probes
// and its look at the models, in the replica's logs.
const ProbeUserAgent = "warmroute-probe"

// errUnhealthy is a probe answered with a status other than 2xx.
var errUnhealthy = errors.New("health probe answered non-2xx")

// Probe asks the replica's health path once and returns nil for a 2xx.
func (r *Replica) Probe(ctx context.Context, client *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+r.set.cfg.HealthPath, nil)
	if err != nil {
		return err
	}
	req.Host = string(r.host)
	req.Header.Set("User-Agent", ProbeUserAgent)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errUnhealthy
	}
	return nil
}

// probeTimedOut reports whether a probe failed by timing out: a replica that
// accepted the connection and did not answer in time.
func probeTimedOut(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		// A dial that timed out is a black hole, not a busy replica.
		var oe *net.OpError
		return !(errors.As(err, &oe) && oe.Op == "dial")
	}
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}
