package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
)

// A replica's own view of its queue, read from its Prometheus page every
// Config.ScrapeInterval. The proxy knows the requests that it sent
// (Waiting, InFlight); the replica also counts those that reached it some
// other way: another warmroute instance, a client that bypasses the
// proxy, a batch job. Only the engines' own names are read; a page that
// has none of them leaves the report empty.
var (
	runningNames = [][]byte{
		[]byte("vllm:num_requests_running"),
		[]byte("sglang:num_running_reqs"),
		[]byte("llamacpp:requests_processing"),
	}
	waitingNames = [][]byte{
		[]byte("vllm:num_requests_waiting"),
		[]byte("sglang:num_queue_reqs"),
		[]byte("llamacpp:requests_deferred"),
	}
	kvNames = [][]byte{
		[]byte("vllm:kv_cache_usage_perc"),
		[]byte("vllm:gpu_cache_usage_perc"), // vLLM before 0.10
		[]byte("sglang:token_usage"),
		[]byte("llamacpp:kv_cache_usage_ratio"),
	}
)

// Report is what a replica said of its own queue on its last scrape.
type Report struct {
	// Running and Waiting are the engine's requests in its batch and in
	// its queue, every caller's, summed over the models it serves.
	Running, Waiting int64
	// KVUsage is the fraction of its KV cache that running requests hold.
	KVUsage float64
	// Ours and OursWaiting are the proxy's requests in flight there, and
	// those of them with no response byte yet, when it answered: what the
	// replica counted of the proxy's own.
	Ours, OursWaiting int64
	// At is when it answered; zero for never.
	At time.Time
	// KVTokens is the KV capacity the page publishes (vLLM's
	// cache_config_info, capacity.go); 0 for none.
	KVTokens int64
}

// Foreign returns the requests running and waiting on the replica that
// the proxy did not send, as of the report: those it cannot see in its own
// counts. A request of the proxy's that has had no byte may be running
// (prefilling) or waiting there: it is taken to be waiting, so that
// foreign waiting is never overcounted.
func (rep *Report) Foreign() (running, waiting int64) {
	waiting = max(rep.Waiting-rep.OursWaiting, 0)
	total := max(rep.Running+rep.Waiting-rep.Ours, 0)
	return max(total-waiting, 0), min(waiting, total)
}

// Reported returns the replica's last report and whether it is fresh:
// answered within reportLife of now. A stale report (the replica stopped
// answering its metrics) must not steer routing; a replica that went down
// loses its report when it comes back (readmit).
func (r *Replica) Reported(now time.Time) (Report, bool) {
	rep := r.report.Load()
	if rep == nil {
		return Report{}, false
	}
	return *rep, now.Sub(rep.At) <= r.set.cfg.reportLife()
}

// reportLife is how long a report counts: three scrape intervals and the
// time one scrape may take (a replica's page is slowest when it is
// busiest, and its report must not lapse then), at least a second.
func (c *Config) reportLife() time.Duration {
	return max(3*c.ScrapeInterval+c.HealthTimeout, time.Second)
}

// scrapeLoop reads r's metrics every ScrapeInterval until ctx ends; a
// replica that is down is not asked.
func (r *Replica) scrapeLoop(ctx context.Context, client *http.Client) {
	t := time.NewTicker(r.set.cfg.ScrapeInterval)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if r.state.Load() != Live {
			continue
		}
		rep, err := r.scrape(ctx, client)
		switch {
		case err == nil:
			r.report.Store(rep)
			warned = false
		case ctx.Err() != nil:
		case !warned:
			// Once until it answers again: a replica without metrics
			// (llama.cpp without --metrics) is not an outage.
			warned = true
			r.set.cfg.Logger.Warn("replica metrics unread; its own queue is not counted until they are", "replica", r.Name, "cause", errText(err))
		default:
			r.set.cfg.Logger.Debug("replica metrics unread", "replica", r.Name, "cause", errText(err))
		}
	}
}

// errNoQueueMetrics is a metrics page with none of the queue's names.
var errNoQueueMetrics = errors.New("metrics page has no queue metrics (vllm:, sglang: or llamacpp: names)")

// scrape asks r for its metrics page once and reads its queue from it.
func (r *Replica) scrape(ctx context.Context, client *http.Client) (*Report, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+r.set.cfg.MetricsPath, nil)
	if err != nil {
		return nil, err
	}
	req.Host = string(r.host)
	req.Header.Set("User-Agent", ProbeUserAgent)
	// The replica counts at some moment between the send and the answer:
	// a request of the proxy's in flight at either end may be in its
	// count, so the larger of the two is taken to be the proxy's own,
	// lest one that ended meanwhile look foreign.
	ours, oursWaiting := r.inflight.Load(), r.waiting.Load()
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return nil, fmt.Errorf("metrics answered %d", resp.StatusCode)
	}
	rep, ok := parseQueue(io.LimitReader(resp.Body, 16<<20))
	if !ok {
		return nil, errNoQueueMetrics
	}
	if rep.KVTokens > 0 {
		r.setKVTokens(rep.KVTokens, r.set.cfg.MetricsPath)
	}
	rep.Ours = max(ours, r.inflight.Load())
	rep.OursWaiting = max(oursWaiting, r.waiting.Load())
	rep.At = time.Now()
	return &rep, nil
}

// parseQueue reads the queue metrics from a Prometheus text page, summing
// each over its label sets, and reports whether it found any.
func parseQueue(page io.Reader) (rep Report, found bool) {
	sc := bufio.NewScanner(page)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	kvN := 0
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if bytes.HasPrefix(line, vllmCacheConfig) {
			rep.KVTokens = vllmCapacity(line)
			continue
		}
		name, v, ok := sample(line)
		if !ok {
			continue
		}
		// A count past maxReported is a broken page: capped, it still
		// says "very busy" without overflowing the cost.
		n := int64(min(v, maxReported))
		switch {
		case oneOf(name, runningNames):
			rep.Running = min(rep.Running+n, maxReported)
		case oneOf(name, waitingNames):
			rep.Waiting = min(rep.Waiting+n, maxReported)
		case oneOf(name, kvNames):
			rep.KVUsage += v
			kvN++
		default:
			continue
		}
		found = true
	}
	if kvN > 1 {
		rep.KVUsage /= float64(kvN) // one cache, reported per model
	}
	rep.KVUsage = min(rep.KVUsage, 1)
	if !found || sc.Err() != nil {
		return Report{}, false
	}
	return rep, true
}

// maxReported caps a reported count of requests.
const maxReported = 1 << 20

// sample splits one sample line, `name{labels} value [timestamp]`, into
// its name and value.
func sample(line []byte) (name []byte, v float64, ok bool) {
	end := bytes.IndexAny(line, "{ ")
	if end <= 0 {
		return nil, 0, false
	}
	name, rest := line[:end], line[end:]
	if rest[0] == '{' {
		i := closingBrace(rest)
		if i < 0 {
			return nil, 0, false
		}
		rest = rest[i+1:]
	}
	rest = bytes.TrimLeft(rest, " ")
	if sp := bytes.IndexByte(rest, ' '); sp >= 0 {
		rest = rest[:sp]
	}
	v, err := strconv.ParseFloat(string(rest), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return nil, 0, false
	}
	return name, v, true
}

// closingBrace returns the index of the brace that closes the label set
// that labels opens, or -1: label values may hold spaces and braces, quoted.
func closingBrace(labels []byte) int {
	inQuote := false
	for i := 1; i < len(labels); i++ {
		switch c := labels[i]; {
		case c == '\\' && inQuote:
			i++
		case c == '"':
			inQuote = !inQuote
		case c == '}' && !inQuote:
			return i
		}
	}
	return -1
}

func oneOf(name []byte, names [][]byte) bool {
	for _, n := range names {
		if bytes.Equal(name, n) {
			return true
		}
	}
	return false
}
