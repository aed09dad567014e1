package upstream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Set is the table of replicas. Its membership can change while requests
// flow (discovery, SIGHUP): a replica takes a free slot of MaxReplicas, and
// its slot index is its Index, the bit that stands for it in every mask on
// the request path. The request path reads slots and masks with atomic
// loads only.
type Set struct {
	slots [MaxReplicas]atomic.Pointer[Replica]
	live  atomic.Pointer[Mask] // slots that hold a live replica
	all   atomic.Pointer[Mask] // slots that hold a replica that is not removed
	cfg   Config

	mu        sync.Mutex // serializes changes of membership and of live
	observers []Observer
	watchCtx  context.Context // set by Watch: new replicas are watched too
	client    *http.Client
	// scrapeClient reads replicas' metrics pages (Config.ScrapeInterval);
	// nil when none are read.
	scrapeClient *http.Client

	modelsMu sync.Mutex
	models   atomic.Pointer[modelTable]
}

// Scrapes reports whether the replicas' own queues are read
// (Config.ScrapeInterval): Replica.Reported then has something to say.
func (s *Set) Scrapes() bool { return s.cfg.ScrapeInterval > 0 }

// Observer is told of every replica that joins the set, and of every one
// that leaves it, once its last request in flight is done (so that its
// series and pins can go, and its slot be reused).
type Observer struct {
	Join, Leave func(*Replica)
}

// NewSet parses the base URLs (http://host:port, or host:port) and returns
// the table, every replica live: no request waits for a first probe.
func NewSet(urls []string, cfg Config) (*Set, error) {
	cfg.setDefaults()
	if len(urls) == 0 {
		return nil, errors.New("no upstream replicas given")
	}
	if len(urls) > MaxReplicas {
		return nil, fmt.Errorf("%d upstream replicas given; at most %d are supported", len(urls), MaxReplicas)
	}
	s := NewEmptySet(cfg)
	seen := map[string]string{}
	for _, raw := range urls {
		_, addr, err := ParseBaseURL(raw)
		if err != nil {
			return nil, err
		}
		if first, dup := seen[addr]; dup {
			return nil, fmt.Errorf("upstream %q is the same replica as %q: each is listed once", raw, first)
		}
		seen[addr] = raw
		if _, err := s.Add(raw, Live); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// NewEmptySet returns a set with no replica yet, for discovery to fill.
func NewEmptySet(cfg Config) *Set {
	cfg.setDefaults()
	s := &Set{cfg: cfg}
	s.live.Store(&Mask{})
	s.all.Store(&Mask{})
	return s
}

// Replica returns the replica in slot i, or nil.
func (s *Set) Replica(i int) *Replica { return s.slots[i].Load() }

// Find returns the slot of the replica named name (its host:port) that is
// in the set and not removed, or -1: how a pin that another instance wrote,
// by name, finds this instance's slot.
func (s *Set) Find(name []byte) int {
	for i := range s.slots {
		if r := s.slots[i].Load(); r != nil && r.state.Load() != Removed && string(r.NameBytes) == string(name) {
			return i
		}
	}
	return -1
}

// Replicas returns the replicas in the set now, removed ones that still
// finish requests included, by slot.
func (s *Set) Replicas() []*Replica {
	var out []*Replica
	for i := range s.slots {
		if r := s.slots[i].Load(); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// Observe registers o and tells it of every replica already in the set.
func (s *Set) Observe(o Observer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observers = append(s.observers, o)
	if o.Join != nil {
		for i := range s.slots {
			if r := s.slots[i].Load(); r != nil && r.state.Load() != Removed {
				o.Join(r)
			}
		}
	}
}

// Add puts the replica at base URL raw into a free slot in state Live (it
// takes requests at once) or Joining (after its first good probe), and
// starts its watcher if the set is watched.
func (s *Set) Add(raw string, state int32) (*Replica, error) {
	u, addr, err := ParseBaseURL(raw)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	free := -1
	for i := range s.slots {
		r := s.slots[i].Load()
		if r == nil {
			if free < 0 {
				free = i
			}
			continue
		}
		if r.addr == addr && r.state.Load() != Removed {
			return nil, fmt.Errorf("upstream %q is already in the set", raw)
		}
	}
	if free < 0 {
		return nil, fmt.Errorf("upstream %q: the set is full (%d replicas)", raw, MaxReplicas)
	}
	r := &Replica{
		Index:     free,
		Name:      addr,
		NameBytes: []byte(addr),
		ID:        xxhash.Sum64String(addr),
		URL:       u,
		addr:      addr,
		host:      []byte(addr),
		wake:      make(chan struct{}, 1),
		set:       s,
		idle:      make([]*Conn, 0, 16),
	}
	if strings.HasPrefix(u, "https://") {
		r.tls = s.replicaTLS(addr)
	}
	r.state.Store(state)
	for _, o := range s.observers {
		if o.Join != nil {
			o.Join(r)
		}
	}
	s.slots[free].Store(r)
	s.refreshLiveLocked()
	s.rebuildModels()
	if s.watchCtx != nil {
		s.startWatch(r)
	}
	return r, nil
}

// Remove takes r out of the set: no new request goes to it, its idle
// connections and its watcher stop, and its requests in flight finish;
// when the last is done, the observers are told and its slot is free.
func (s *Set) Remove(r *Replica) {
	if r.state.Swap(Removed) == Removed {
		return
	}
	s.refreshLive()
	if r.stopWatch != nil {
		r.stopWatch()
	}
	r.DropIdle()
	s.cfg.Logger.Info("replica removed from the set", "replica", r.Name, "in_flight", r.InFlight())
	if r.inflight.Load() == 0 {
		s.release(r)
	}
}

// release gives r's slot back once r is removed and idle. It runs once.
func (s *Set) release(r *Replica) {
	if !r.released.CompareAndSwap(false, true) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.observers {
		if o.Leave != nil {
			o.Leave(r)
		}
	}
	s.slots[r.Index].CompareAndSwap(r, nil)
	s.rebuildModels()
}

// Reconcile makes the set hold exactly the replicas at urls: the missing
// ones are added as Joining (they take requests after a good probe), the
// ones no longer listed are removed. Base URLs that do not parse are
// skipped and returned as errors; the rest still apply.
func (s *Set) Reconcile(urls []string) []error {
	var errs []error
	want := map[string]string{}
	for _, raw := range urls {
		_, addr, err := ParseBaseURL(raw)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		want[addr] = raw
	}
	for _, r := range s.Replicas() {
		if _, ok := want[r.addr]; ok && r.state.Load() != Removed {
			delete(want, r.addr)
		} else if !ok {
			s.Remove(r)
		}
	}
	for _, raw := range want {
		if _, err := s.Add(raw, Joining); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func (s *Set) refreshLive() {
	s.mu.Lock()
	s.refreshLiveLocked()
	s.mu.Unlock()
}

// refreshLiveLocked recomputes the masks from the replicas' states; every
// change of state calls it after its own, so the last call sees the last
// states.
func (s *Set) refreshLiveLocked() {
	var live, all Mask
	for i := range s.slots {
		r := s.slots[i].Load()
		if r == nil {
			continue
		}
		switch r.state.Load() {
		case Live:
			live.Add(i)
			all.Add(i)
		case Removed:
		default:
			all.Add(i)
		}
	}
	s.live.Store(&live)
	s.all.Store(&all)
}

// LiveMask returns the slots of the live replicas.
func (s *Set) LiveMask() Mask { return *s.live.Load() }

// Avail returns the live replicas that are not skipped for a Retry-After
// at now, and the live ones: the caller falls back on the live ones when
// every live replica is skipped, since a skip is a back-off, not a
// demotion.
func (s *Set) Avail(now time.Time) (avail, live Mask) {
	t := now.UnixNano()
	live = *s.live.Load()
	for j, w := range live {
		for ; w != 0; w &= w - 1 {
			i := j*64 + bits.TrailingZeros64(w)
			if r := s.slots[i].Load(); r != nil && r.skipUntil.Load() <= t {
				avail.Add(i)
			}
		}
	}
	return avail, live
}

// RetryAfter is how long until the next demoted replica is probed again, in
// whole seconds (at least 1): the Retry-After of a 503 when all are down.
func (s *Set) RetryAfter(now time.Time) int {
	soonest := int64(math.MaxInt64)
	for i := range s.slots {
		if r := s.slots[i].Load(); r != nil && r.state.Load() == Down {
			if t := r.retryAt.Load(); t < soonest {
				soonest = t
			}
		}
	}
	secs := int((soonest - now.UnixNano() + int64(time.Second) - 1) / int64(time.Second))
	if secs < 1 || soonest == math.MaxInt64 {
		return 1
	}
	return secs
}
