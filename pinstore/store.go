// Package pinstore keeps the pins that several warmroute instances cannot
// compute in Redis: pins that differ from the deterministic placement (load
// moved them, a replica died, a Responses API id), and pins that must outlive
// a restart.
//
// A Store is a hint, never a dependency: a request never fails or waits
// past Options.Timeout because of it. Put queues a pin and returns at once;
// one goroutine writes the queue in pipelined batches of
// `SET key replica PX ttl`. Get reads a pin on a local miss; one that Redis
// answered before comes from rueidis's client-side cache, which Redis's
// invalidation messages keep coherent. Reads and writes use two
// connections, so that a burst of writes never queues a read behind it and
// a write's reconnect never holds a read past its budget.
//
// A prefix pin's key is Options.Prefix followed by its Link in 16 raw bytes
// (Hash then Check, big-endian); its value is the replica's address, not a
// slot index, since indexes differ between instances. A Responses id's key
// is the prefix, "id:" and the id. docs/pinstore.md has the memory a pin
// takes in Redis, what a read costs, and what happens while Redis is down.
package pinstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"

	"github.com/warmroute/warmroute/prefixcache"
)

// Defaults of Options.
const (
	DefaultTimeout       = 2 * time.Millisecond
	DefaultTTL           = time.Hour
	DefaultPrefix        = "warmroute:pin:"
	DefaultQueueSize     = 8192
	DefaultCacheTTL      = time.Minute
	DefaultCacheBytes    = 16 << 20
	DefaultRetryInterval = time.Second
	DefaultWriteTimeout  = time.Second
)

// LinkKeyBytes is the length of a prefix pin's key past Options.Prefix.
const LinkKeyBytes = 16

// maxBatch bounds the SET commands pipelined in one DoMulti.
const maxBatch = 256

// logEvery bounds how often the "unreachable" line is logged.
const logEvery = time.Minute

// Options tune a Store; the zero value of each field means its default.
type Options struct {
	// Timeout bounds the wait of one Get on Redis (default 2ms).
	Timeout time.Duration
	// TTL is a pin's lifetime in Redis (default 1h); each Put renews it.
	TTL time.Duration
	// Prefix is the key namespace (default "warmroute:pin:"). Instances that
	// share pins must share it; ones that must not, must not.
	Prefix string
	// QueueSize bounds the pins waiting to be written (default 8192); a Put
	// that finds the queue full is dropped and counted.
	QueueSize int
	// CacheTTL bounds how long a read is served from the client-side cache
	// (default 1m). Redis invalidates a cached read when the key changes or
	// expires, and rueidis drops the cache with its connection, so this only
	// bounds staleness if an invalidation is lost.
	CacheTTL time.Duration
	// CacheBytes bounds the client-side cache (default 16 MiB).
	CacheBytes int
	// RetryInterval is how long the store stays down after a failure before
	// it probes Redis again, and the interval of connection attempts while
	// Redis cannot be reached (default 1s).
	RetryInterval time.Duration
	// WriteTimeout bounds one pipelined batch of writes, a probe, and a
	// connection attempt (default 1s). No request waits on it.
	WriteTimeout time.Duration
	// Logger gets the store's few lines (default slog.Default()).
	Logger *slog.Logger
}

// Stats are a Store's counters since Open.
type Stats struct {
	// Reads by result: a pin found (Hits, of which CacheHits were served by
	// the client-side cache), no pin in Redis (Misses), a failed or timed out
	// read (ReadErrors, of which Timeouts ran past Options.Timeout), and
	// reads not sent because the store was down, connecting or closed
	// (Skipped).
	Hits, CacheHits, Misses, ReadErrors, Timeouts, Skipped uint64
	// Writes are pins written; Dropped are pins not written (queue full, the
	// store down, or a failed batch).
	Writes, Dropped uint64
	// Errors counts failed operations: reads, write batches, probes and
	// connection attempts.
	Errors uint64
	// Up says whether the store is sending reads now.
	Up bool
}

// The states of a Store.
const (
	stateConnecting int32 = iota // no client yet
	stateUp
	stateDown
	stateClosed
)

type pin struct {
	link    prefixcache.Link
	id      string // a Responses id; empty for a prefix pin
	replica string
	// synced marks a Sync: it is closed once the pins queued before it
	// were written or dropped, and the pin is no pin.
	synced chan struct{}
}

// Store is a client of the pin store. Its methods are safe for concurrent
// use; Put and Get never fail a request.
type Store struct {
	opt   Options
	copt  rueidis.ClientOption
	addr  string
	log   *slog.Logger
	state atomic.Int32
	// slowReads counts the reads in a row that timed out.
	slowReads atomic.Int32
	read      atomic.Pointer[clientBox] // reads, with client-side caching
	writer    rueidis.Client            // writes; owned by the drain goroutine
	queue     chan pin
	// tripped wakes the drain goroutine when a read marks the store down.
	tripped chan struct{}
	closing chan struct{}
	done    chan struct{}
	once    sync.Once

	logMu      sync.Mutex
	lastDown   time.Time
	loggedDown bool
	suppressed int

	set                                                  *metrics.Set
	hits, cacheHits, misses, readErrs, timeouts, skipped *metrics.Counter
	writes, dropped, errs                                *metrics.Counter
}

type clientBox struct{ c rueidis.Client }

// Open returns a Store for rawURL, `redis://[user:pass@]host:port/db`
// (also `rediss://` for TLS, and `unix:///path?db=N`). It fails only for a
// malformed URL or options: when Redis cannot be reached, the Store is
// returned anyway, counts its reads as skipped, and connects in the
// background.
func Open(rawURL string, opt Options) (*Store, error) {
	copt, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if opt.Timeout < 0 || opt.TTL < 0 || opt.QueueSize < 0 || opt.CacheTTL < 0 || opt.CacheBytes < 0 || opt.RetryInterval < 0 || opt.WriteTimeout < 0 {
		return nil, errors.New("pinstore: negative option")
	}
	if opt.TTL > 0 && opt.TTL < time.Millisecond {
		return nil, fmt.Errorf("pinstore: TTL %v is under Redis's 1ms resolution", opt.TTL)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&opt.Timeout, DefaultTimeout)
	def(&opt.TTL, DefaultTTL)
	def(&opt.CacheTTL, DefaultCacheTTL)
	def(&opt.RetryInterval, DefaultRetryInterval)
	def(&opt.WriteTimeout, DefaultWriteTimeout)
	if opt.Prefix == "" {
		opt.Prefix = DefaultPrefix
	}
	if opt.QueueSize == 0 {
		opt.QueueSize = DefaultQueueSize
	}
	if opt.CacheBytes == 0 {
		opt.CacheBytes = DefaultCacheBytes
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	copt.Dialer.Timeout = opt.WriteTimeout
	copt.ConnWriteTimeout = max(opt.WriteTimeout, time.Second)
	copt.CacheSizeEachConn = opt.CacheBytes
	copt.ReadBufferEachConn = 64 << 10
	copt.WriteBufferEachConn = 64 << 10
	copt.PipelineMultiplex = -1 // one connection a client: a probe warms what reads use
	copt.DisableRetry = true    // the store decides what a failure means
	copt.ClientName = "warmroute"
	copt.ClientSetInfo = rueidis.DisableClientSetInfo

	s := &Store{
		opt: opt, copt: copt, addr: strings.Join(copt.InitAddress, ","), log: opt.Logger,
		queue:   make(chan pin, opt.QueueSize),
		tripped: make(chan struct{}, 1),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		set:     metrics.NewSet(),
	}
	s.hits = s.set.NewCounter(`warmroute_pin_store_reads_total{result="hit"}`)
	s.misses = s.set.NewCounter(`warmroute_pin_store_reads_total{result="miss"}`)
	s.readErrs = s.set.NewCounter(`warmroute_pin_store_reads_total{result="error"}`)
	s.skipped = s.set.NewCounter(`warmroute_pin_store_reads_total{result="skipped"}`)
	s.cacheHits = s.set.NewCounter(`warmroute_pin_store_client_cache_hits_total`)
	s.timeouts = s.set.NewCounter(`warmroute_pin_store_timeouts_total`)
	s.writes = s.set.NewCounter(`warmroute_pin_store_writes_total`)
	s.dropped = s.set.NewCounter(`warmroute_pin_store_dropped_total`)
	s.errs = s.set.NewCounter(`warmroute_pin_store_errors_total`)
	s.set.NewGauge(`warmroute_pin_store_up`, func() float64 {
		if s.state.Load() == stateUp {
			return 1
		}
		return 0
	})
	s.set.NewGauge(`warmroute_pin_store_queued`, func() float64 { return float64(len(s.queue)) })
	go s.run()
	return s, nil
}

// ParseURL checks rawURL as Open does and returns the rueidis options it
// names, for flag validation.
func ParseURL(rawURL string) (rueidis.ClientOption, error) {
	var zero rueidis.ClientOption
	u, err := url.Parse(rawURL)
	if err != nil {
		return zero, fmt.Errorf("pinstore: bad URL %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "redis", "rediss":
		if u.Hostname() == "" {
			return zero, fmt.Errorf("pinstore: bad URL %q: no host (want redis://host:port/db)", rawURL)
		}
	case "unix":
		if u.Path == "" {
			return zero, fmt.Errorf("pinstore: bad URL %q: no socket path (want unix:///path/to/redis.sock?db=N)", rawURL)
		}
	default:
		return zero, fmt.Errorf("pinstore: bad URL %q: scheme %q is not redis, rediss or unix (want redis://host:port/db)", rawURL, u.Scheme)
	}
	q := u.Query()
	if q.Has("addr") || q.Has("master_set") {
		return zero, fmt.Errorf("pinstore: bad URL %q: one Redis only (no addr= or master_set=)", rawURL)
	}
	if u.Scheme != "unix" && u.Path == "/" { // redis://host:port/ is database 0, as with no path
		u.Path = ""
		rawURL = u.String()
	}
	copt, err := rueidis.ParseURL(rawURL)
	if err != nil {
		return zero, fmt.Errorf("pinstore: bad URL %q: %w", rawURL, err)
	}
	if copt.SelectDB < 0 {
		return zero, fmt.Errorf("pinstore: bad URL %q: negative database number", rawURL)
	}
	return copt, nil
}

// AppendLinkKey appends the key of l's pin, past the prefix, to dst.
func AppendLinkKey(dst []byte, l prefixcache.Link) []byte {
	dst = binary.BigEndian.AppendUint64(dst, l.Hash)
	return binary.BigEndian.AppendUint64(dst, l.Check)
}

// linkKey returns l's full key: one allocation, kept by the client-side
// cache on a miss.
func (s *Store) linkKey(l prefixcache.Link) string {
	var b [64]byte
	k := append(b[:0], s.opt.Prefix...)
	return string(AppendLinkKey(k, l))
}

func (s *Store) idKey(id string) string { return s.opt.Prefix + "id:" + id }

// Put pins l to replica (its address) in Redis, asynchronously: it never
// blocks, and when the queue is full or the store is closed the pin is
// dropped and counted. replica must not alias a buffer that is reused.
func (s *Store) Put(l prefixcache.Link, replica string) {
	s.enqueue(pin{link: l, replica: replica})
}

// PutID pins a Responses API id to replica, as Put does.
func (s *Store) PutID(id, replica string) {
	if id == "" {
		return
	}
	s.enqueue(pin{id: id, replica: replica})
}

func (s *Store) enqueue(p pin) {
	if s.state.Load() == stateClosed {
		s.dropped.Inc()
		return
	}
	select {
	case s.queue <- p:
	default:
		s.dropped.Inc()
	}
}

// Sync waits until every pin that Put and PutID queued before it was
// written or dropped, or the store is closed: another instance that reads
// the store after Sync finds what this one pinned before it.
func (s *Store) Sync() {
	done := make(chan struct{})
	select {
	case s.queue <- pin{synced: done}:
	case <-s.done:
		return
	}
	select {
	case <-done:
	case <-s.done:
	}
}

// syncedLast moves the Sync markers of batch to its end and returns the
// number of pins before them.
func syncedLast(batch []pin) int {
	n := 0
	for i := range batch {
		if batch[i].synced == nil {
			batch[n], batch[i] = batch[i], batch[n]
			n++
		}
	}
	return n
}

// release closes the Sync markers that end batch after its first n pins.
func release(batch []pin, n int) {
	for _, p := range batch[n:] {
		close(p.synced)
	}
}

// Get returns the replica address pinned to l in Redis, waiting at most
// Options.Timeout. It answers false for no pin, a failure, a timeout, and at
// once while the store is down.
func (s *Store) Get(l prefixcache.Link) (string, bool) {
	if s.state.Load() != stateUp {
		s.skipped.Inc()
		return "", false
	}
	return s.get(s.linkKey(l))
}

// AppendGet appends the replica address pinned to l to dst, as Get reads it.
// The bytes are copied: dst may be reused at once.
func (s *Store) AppendGet(dst []byte, l prefixcache.Link) ([]byte, bool) {
	v, ok := s.Get(l)
	return append(dst, v...), ok
}

// GetID returns the replica pinned to a Responses API id, as Get does.
func (s *Store) GetID(id string) (string, bool) {
	if s.state.Load() != stateUp {
		s.skipped.Inc()
		return "", false
	}
	return s.get(s.idKey(id))
}

func (s *Store) get(key string) (string, bool) {
	c := s.read.Load().c
	// A plain deadline context: a pooled one that rueidis could still
	// hold after the read returned let a later read see an earlier
	// read's state (timeouts of reads that had time left).
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.Timeout)
	// ToStaticTTL: one GET (after CLIENT CACHING YES), without the
	// MULTI/PTTL/EXEC that would cap the cached copy at the key's TTL; Redis
	// invalidates the copy when the key changes or expires, and CacheTTL
	// bounds it if an invalidation is lost.
	r := c.DoCache(ctx, c.B().Get().Key(key).Cache().ToStaticTTL(), s.opt.CacheTTL)
	cancel()
	v, err := r.ToString()
	if err == nil || rueidis.IsRedisNil(err) {
		s.slowReads.Store(0)
	}
	switch {
	case err == nil:
		s.hits.Inc()
		if r.IsCacheHit() {
			s.cacheHits.Inc()
		}
		return v, true
	case rueidis.IsRedisNil(err):
		s.misses.Inc()
		return "", false
	}
	s.readErrs.Inc()
	if errors.Is(err, context.DeadlineExceeded) {
		s.timeouts.Inc()
		// One slow read on a busy host is not an outage: the store
		// goes down (its reads skipped, its writes dropped) only after
		// slowReadsDown timeouts in a row, or any other error.
		if s.slowReads.Add(1) < slowReadsDown {
			return "", false
		}
	}
	s.fail(err)
	return "", false
}

// slowReadsDown is how many reads in a row may time out before the store
// is taken for down.
const slowReadsDown = 3

// fail counts a failed operation and marks the store down, once.
func (s *Store) fail(err error) {
	s.errs.Inc()
	if s.state.CompareAndSwap(stateUp, stateDown) {
		s.logDown(err)
		select {
		case s.tripped <- struct{}{}:
		default:
		}
	}
}

func (s *Store) logDown(err error) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	now := time.Now()
	if s.loggedDown || (!s.lastDown.IsZero() && now.Sub(s.lastDown) < logEvery) {
		s.suppressed++
		return
	}
	args := []any{"addr", s.addr, "err", err, "retry_every", s.opt.RetryInterval}
	if s.suppressed > 0 {
		args = append(args, "outages_not_logged", s.suppressed)
		s.suppressed = 0
	}
	s.log.Warn("pin store unreachable; using local pins only", args...)
	s.lastDown, s.loggedDown = now, true
}

func (s *Store) logUp() {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	if s.loggedDown {
		s.log.Info("pin store reachable again", "addr", s.addr)
		s.loggedDown = false
	}
}

// Up says whether the store sends reads now.
func (s *Store) Up() bool { return s.state.Load() == stateUp }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Hits: s.hits.Get(), CacheHits: s.cacheHits.Get(), Misses: s.misses.Get(),
		ReadErrors: s.readErrs.Get(), Timeouts: s.timeouts.Get(), Skipped: s.skipped.Get(),
		Writes: s.writes.Get(), Dropped: s.dropped.Get(), Errors: s.errs.Get(),
		Up: s.Up(),
	}
}

// WritePrometheus writes the store's series: warmroute_pin_store_reads_total
// {result="hit|miss|error|skipped"}, _client_cache_hits_total,
// _timeouts_total, _writes_total, _dropped_total, _errors_total, _up and
// _queued.
func (s *Store) WritePrometheus(w io.Writer) { s.set.WritePrometheus(w) }

// Close writes what is queued (waiting at most Options.WriteTimeout for it)
// and closes the connections. Puts after Close are dropped; Gets skipped.
func (s *Store) Close() {
	s.once.Do(func() {
		close(s.closing)
		<-s.done
	})
}

// run connects, writes the queue, and probes Redis while the store is down.
// It is the only goroutine that changes the state but for a read's failure.
func (s *Store) run() {
	defer close(s.done)
	probe := time.NewTimer(0) // connect at once
	defer probe.Stop()
	batch := make([]pin, 0, maxBatch)
	for {
		select {
		case p := <-s.queue:
			batch = s.collect(append(batch[:0], p))
			n := syncedLast(batch)
			s.flush(batch[:n])
			release(batch, n)
		case <-s.tripped:
			probe.Reset(s.opt.RetryInterval)
		case <-probe.C:
			if s.state.Load() != stateUp && !s.probe() {
				probe.Reset(s.opt.RetryInterval)
			}
		case <-s.closing:
			s.shutdown(batch)
			return
		}
	}
}

// collect adds to batch what else is queued, up to maxBatch.
func (s *Store) collect(batch []pin) []pin {
	for len(batch) < maxBatch {
		select {
		case p := <-s.queue:
			batch = append(batch, p)
		default:
			return batch
		}
	}
	return batch
}

// probe connects the clients if need be and PINGs both, and marks the store
// up when they answer.
func (s *Store) probe() bool {
	if s.read.Load() == nil {
		rc, err := rueidis.NewClient(s.copt)
		if err != nil {
			s.connectFailed(err)
			return false
		}
		wopt := s.copt
		wopt.DisableCache = true
		wc, err := rueidis.NewClient(wopt)
		if err != nil {
			rc.Close()
			s.connectFailed(err)
			return false
		}
		s.writer = wc
		s.read.Store(&clientBox{rc})
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.WriteTimeout)
	defer cancel()
	rc := s.read.Load().c
	for _, c := range []rueidis.Client{rc, s.writer} {
		if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
			s.connectFailed(err)
			return false
		}
	}
	if s.state.CompareAndSwap(stateConnecting, stateUp) || s.state.CompareAndSwap(stateDown, stateUp) {
		s.logUp()
	}
	return true
}

// connectFailed counts a failed connection or probe; the first one at start
// is logged as an outage.
func (s *Store) connectFailed(err error) {
	s.errs.Inc()
	if s.state.CompareAndSwap(stateConnecting, stateDown) {
		s.logDown(err)
	}
}

// flush writes batch in one pipeline, or drops it while the store is down.
func (s *Store) flush(batch []pin) {
	if len(batch) == 0 {
		return
	}
	if s.state.Load() != stateUp {
		s.dropped.Add(len(batch))
		return
	}
	if err := s.write(batch); err != nil {
		s.fail(err)
	}
}

// write sends batch as one pipeline of SETs and counts what landed; it
// returns the first error.
func (s *Store) write(batch []pin) error {
	c := s.writer
	cmds := make(rueidis.Commands, 0, len(batch))
	ttl := s.opt.TTL.Milliseconds()
	for _, p := range batch {
		key := p.id
		if key == "" {
			key = s.linkKey(p.link)
		} else {
			key = s.idKey(key)
		}
		cmds = append(cmds, c.B().Set().Key(key).Value(p.replica).PxMilliseconds(ttl).Build())
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.WriteTimeout)
	res := c.DoMulti(ctx, cmds...)
	cancel()
	var failed int
	var first error
	for _, r := range res {
		if err := r.Error(); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	s.writes.Add(len(batch) - failed)
	s.dropped.Add(failed)
	return first
}

// shutdown writes what is queued if the store is up, within WriteTimeout,
// and closes the clients.
func (s *Store) shutdown(batch []pin) {
	wasUp := s.state.Swap(stateClosed) == stateUp // Gets skip, Puts drop from now on
	deadline := time.Now().Add(s.opt.WriteTimeout)
	for wasUp && time.Now().Before(deadline) {
		batch = s.collect(batch[:0])
		if len(batch) == 0 {
			break
		}
		n := syncedLast(batch)
		var err error
		if n > 0 {
			err = s.write(batch[:n])
		}
		release(batch, n)
		if err != nil {
			s.errs.Inc()
			break
		}
	}
	for drained := false; !drained; {
		select {
		case p := <-s.queue:
			if p.synced != nil {
				close(p.synced)
			} else {
				s.dropped.Inc()
			}
		default:
			drained = true
		}
	}
	if b := s.read.Load(); b != nil {
		b.c.Close()
		s.writer.Close()
	}
}
