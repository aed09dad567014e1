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
// HealthInterval, a demoted one at the end of its cooldown. It starts one
// goroutine per replica and returns at once.
func (s *Set) Watch(ctx context.Context) {
	client := &http.Client{
		Timeout: s.cfg.HealthTimeout,
		Transport: &http.Transport{
			DialContext:       (&net.Dialer{Timeout: s.cfg.ConnectTimeout}).DialContext,
			DisableKeepAlives: true, // a probe must prove that a new connection works
		},
	}
	for _, r := range s.Replicas {
		go r.watch(ctx, client)
	}
}

func (r *Replica) watch(ctx context.Context, client *http.Client) {
	cfg := &r.set.cfg
	timer := time.NewTimer(cfg.HealthInterval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
			// Demoted: probe at the end of the cooldown, not on the tick.
			timer.Reset(time.Until(time.Unix(0, r.retryAt.Load())))
			continue
		case <-timer.C:
		}
		err := r.Probe(ctx, client)
		if ctx.Err() != nil {
			return
		}
		next := cfg.HealthInterval
		switch {
		case r.state.Load() == Down && err == nil:
			r.readmit()
		case r.state.Load() == Down:
			cd := min(2*time.Duration(r.cooldown.Load()), cfg.MaxCooldown)
			r.cooldown.Store(int64(cd))
			r.retryAt.Store(time.Now().Add(cd).UnixNano())
			cfg.Logger.Debug("replica still down", "replica", r.Name, "cause", errText(err), "cooldown", cd)
			next = cd
		case err != nil && !isTimeout(err):
			// A live replica that refuses the probe is down. One that is
			// only slow to answer is busy, not dead: no flapping under load.
			if r.Demote(err, time.Now()) {
				// Drain the wake-up that Demote sent; the timer is set here.
				select {
				case <-r.wake:
				default:
				}
				next = cfg.Cooldown
			}
		}
		timer.Reset(next)
	}
}

// errUnhealthy is a probe answered with a status other than 2xx.
var errUnhealthy = errors.New("health probe answered non-2xx")

// Probe asks the replica's health path once and returns nil for a 2xx.
func (r *Replica) Probe(ctx context.Context, client *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.addr+string(r.prefix)+r.set.cfg.HealthPath, nil)
	if err != nil {
		return err
	}
	req.Host = string(r.host)
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

func isTimeout(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		// A dial that timed out is a black hole, not a busy replica.
		var oe *net.OpError
		return !(errors.As(err, &oe) && oe.Op == "dial")
	}
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}
