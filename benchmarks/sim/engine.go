package sim

import (
	"sync"
	"time"
)

// engine is the continuous-batching loop of one replica. It keeps model
// time (vt, in real-scale seconds since start) and sleeps so that model
// time runs TimeScale times faster than the wall clock; a step that the
// wall clock cannot keep up with is not stretched, so host noise delays
// tokens but never changes the durations the engine reports.
type engine struct {
	cfg Config

	mu      sync.Mutex
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	waiting []*seq
	running []*seq
	cache   *blockCache
	start   time.Time
	vt      float64 // model seconds at the end of the last step
	idle    bool

	// counters for /metrics, in tokens
	promptTokens, cachedTokens, generated uint64
	requestsDone                          uint64
	// prefillBusy is the model seconds of the steps that prefilled.
	prefillBusy float64
}

// seq is one request inside the engine.
type seq struct {
	blocks       []uint64
	promptTokens int
	cachedTokens int
	prefillLeft  int
	outLeft      int
	outTotal     int
	arrival      float64 // model time
	firstToken   float64
	admitted     bool
	// tokens receives one value per generated token and is closed at the
	// end, or when the request is aborted.
	tokens  chan struct{}
	aborted bool
}

func newEngine(cfg Config) *engine {
	e := &engine{
		cfg:   cfg,
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		cache: newBlockCache(cfg.KVCapacityTokens / cfg.BlockTokens),
		start: time.Now(),
		idle:  true,
	}
	go e.loop()
	return e
}

// now is the model time of the wall clock.
func (e *engine) now() float64 {
	return time.Since(e.start).Seconds() * e.cfg.TimeScale
}

// submit queues a request; its tokens arrive on the returned seq's channel.
func (e *engine) submit(blocks []uint64, promptTokens, maxTokens int) *seq {
	s := &seq{blocks: blocks, promptTokens: max(promptTokens, 1), outLeft: max(maxTokens, 1),
		outTotal: max(maxTokens, 1), tokens: make(chan struct{}, max(maxTokens, 1))}
	e.mu.Lock()
	// A busy engine admits the request at the end of its current step; an
	// idle one at once.
	s.arrival = e.vt
	if e.idle {
		s.arrival = max(e.now(), e.vt)
	}
	e.waiting = append(e.waiting, s)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return s
}

// abort drops a request whose client left, as vLLM aborts on disconnect.
func (e *engine) abort(s *seq) {
	e.mu.Lock()
	s.aborted = true
	e.mu.Unlock()
}

func (e *engine) close() {
	close(e.stop)
	<-e.done
	e.mu.Lock()
	for _, s := range append(e.waiting, e.running...) {
		close(s.tokens)
	}
	e.waiting, e.running = nil, nil
	e.mu.Unlock()
}

func (e *engine) loop() {
	defer close(e.done)
	for {
		e.mu.Lock()
		for len(e.waiting) == 0 && len(e.running) == 0 {
			e.idle = true
			e.mu.Unlock()
			select {
			case <-e.wake:
			case <-e.stop:
				return
			}
			e.mu.Lock()
		}
		if e.idle {
			// An idle engine's clock jumps to now.
			e.vt = max(e.vt, e.now())
			e.idle = false
		}
		prefillCost, decoding := e.schedule()
		dur := e.cfg.StepBase + prefillCost + time.Duration(decoding)*e.cfg.DecodePerSeq
		e.vt += dur.Seconds()
		if prefillCost > 0 {
			e.prefillBusy += dur.Seconds()
		}
		wakeAt := e.start.Add(time.Duration(e.vt / e.cfg.TimeScale * float64(time.Second)))
		e.mu.Unlock()

		if d := time.Until(wakeAt); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-e.stop:
				t.Stop()
				return
			}
		}
		e.mu.Lock()
		e.finishStep()
		e.mu.Unlock()
	}
}

// schedule admits waiting requests, then spends the step's prefill budget
// first come first served. It returns the prefill time and the number of
// decoding sequences of the step.
func (e *engine) schedule() (prefill time.Duration, decoding int) {
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxRunning {
		s := e.waiting[0]
		e.waiting = e.waiting[1:]
		if s.aborted {
			close(s.tokens)
			continue
		}
		cached := e.cache.prefix(s.blocks) * e.cfg.BlockTokens
		if cached >= s.promptTokens {
			cached = s.promptTokens - 1 // the last token is always computed
		}
		s.cachedTokens = cached
		s.prefillLeft = s.promptTokens - cached
		s.admitted = true
		e.promptTokens += uint64(s.promptTokens)
		e.cachedTokens += uint64(cached)
		e.running = append(e.running, s)
	}
	budget := e.cfg.PrefillBudget
	for _, s := range e.running {
		switch {
		case s.prefillLeft > 0 && budget > 0:
			take := min(s.prefillLeft, budget)
			// Each new token attends to every token before it: a chunk
			// late in a long prompt costs more than one at its start.
			pos := s.promptTokens - s.prefillLeft
			prefill += time.Duration(take)*e.cfg.PrefillPerToken +
				time.Duration(float64(take)*(float64(pos)+float64(take)/2)/1000*float64(e.cfg.PrefillAttention))
			s.prefillLeft -= take
			budget -= take
			if s.prefillLeft == 0 {
				s.prefillLeft = -1 // prefill ends with this step
			}
		case s.prefillLeft == 0:
			decoding++
		}
	}
	return prefill, decoding
}

// finishStep emits the step's tokens: a first token for each sequence whose
// prefill completed, one more for each decoding sequence.
func (e *engine) finishStep() {
	kept := e.running[:0]
	for _, s := range e.running {
		if s.aborted {
			close(s.tokens)
			continue
		}
		switch {
		case s.prefillLeft == -1:
			s.prefillLeft = 0
			s.firstToken = e.vt
			e.cache.insert(s.blocks)
		case s.prefillLeft > 0:
			kept = append(kept, s)
			continue
		}
		s.tokens <- struct{}{}
		s.outLeft--
		e.generated++
		if s.outLeft == 0 {
			close(s.tokens)
			e.requestsDone++
			continue
		}
		kept = append(kept, s)
	}
	for i := len(kept); i < len(e.running); i++ {
		e.running[i] = nil
	}
	e.running = kept
}

// busy returns the model seconds of the steps that prefilled, and the
// model time now.
func (e *engine) busy() (prefill, now float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.prefillBusy, max(e.vt, e.now())
}

// stats is a snapshot for /metrics.
type stats struct {
	running, waiting                      int
	promptTokens, cachedTokens, generated uint64
	requestsDone                          uint64
	cacheBlocks                           int
	// kvUsage is the fraction of the KV cache that running requests hold,
	// vLLM's kv_cache_usage_perc: cached blocks that no request holds
	// count as free, since they are evicted on demand.
	kvUsage float64
}

func (e *engine) stats() stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	held := 0
	for _, s := range e.running {
		tokens := s.outTotal - s.outLeft
		if s.prefillLeft > 0 {
			tokens += s.promptTokens - s.prefillLeft
		} else {
			tokens += s.promptTokens
		}
		held += (tokens + e.cfg.BlockTokens - 1) / e.cfg.BlockTokens
	}
	usage := min(float64(held*e.cfg.BlockTokens)/float64(e.cfg.KVCapacityTokens), 1)
	return stats{len(e.running), len(e.waiting), e.promptTokens, e.cachedTokens, e.generated, e.requestsDone, e.cache.len(), usage}
}
