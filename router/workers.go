package router

import (
	"slices"
	"sync"
	"time"
)

// workers runs each piece of work on a parked goroutine when one is idle,
// as fasthttp's worker pool does, rather than on a new goroutine: a new
// goroutine's stack starts at 2 KiB and is copied each time it doubles, to
// the relay's 4 KiB and then to the handler's 8 KiB, and those copies cost
// an SSE request 2% of its CPU (perf: runtime.step, runtime.pcvalue). A
// worker keeps the stack that its work grew. Handing work over is a mutex
// and a send on the worker's own channel: a select with an idle timer per
// wait cost three times the instructions (cachegrind). A worker left idle
// for one to two workerIdle exits: a cleaner counts the periods, and stops
// the workers that went idle before the last one (no clock read per work).
type workers[T any] struct {
	run    func(T)
	mu     sync.Mutex
	ready  []*worker[T] // idle, the longest idle first
	period uint64       // the cleaner's periods, under mu
	start  sync.Once
}

type worker[T any] struct {
	work chan T // capacity 1: a handoff does not wait for the worker
	idle uint64 // the period it went idle in
}

const workerIdle = time.Second

// do runs run(v) on an idle worker, or on a new one.
func (p *workers[T]) do(v T) {
	p.mu.Lock()
	n := len(p.ready)
	if n == 0 {
		p.mu.Unlock()
		p.start.Do(func() { go p.clean() })
		w := &worker[T]{work: make(chan T, 1)}
		w.work <- v
		go p.loop(w)
		return
	}
	w := p.ready[n-1] // the most recently used: its stack is the warmest
	p.ready[n-1] = nil
	p.ready = p.ready[:n-1]
	p.mu.Unlock()
	w.work <- v
}

func (p *workers[T]) loop(w *worker[T]) {
	for v := range w.work {
		p.run(v)
		p.mu.Lock()
		w.idle = p.period
		p.ready = append(p.ready, w)
		p.mu.Unlock()
	}
}

// clean stops the workers idle for a whole period or more.
func (p *workers[T]) clean() {
	t := time.NewTicker(workerIdle)
	defer t.Stop()
	for range t.C {
		p.mu.Lock()
		p.period++
		i := 0
		for i < len(p.ready) && p.ready[i].idle+1 < p.period {
			close(p.ready[i].work)
			i++
		}
		p.ready = slices.Delete(p.ready, 0, i) // clears what it drops
		p.mu.Unlock()
	}
}
