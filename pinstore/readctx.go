package pinstore

import (
	"context"
	"sync"
	"time"
)

// readCtx is the context of one Get: a deadline, and a Done channel made
// only when something waits on it. A read served by the client-side cache
// never looks at its context, so it makes no channel and arms no timer;
// context.WithTimeout would make both, and four allocations, for every read.
// readCtxs are pooled, each with a timer that is reused; after release a
// late caller of Done gets a channel that is already closed.
type readCtx struct {
	mu       sync.Mutex
	deadline time.Time
	done     chan struct{} // made by the first Done of this use
	closed   bool          // done is closed
	timer    *time.Timer   // fires c.expire; made once, reset for each use
}

var readCtxs = sync.Pool{New: func() any { return new(readCtx) }}

func newReadCtx(timeout time.Duration) *readCtx {
	c := readCtxs.Get().(*readCtx)
	c.mu.Lock()
	c.deadline = time.Now().Add(timeout)
	c.mu.Unlock()
	return c
}

// release ends this use: a Done channel made for it is closed and the timer
// stopped, and c goes back to the pool.
func (c *readCtx) release() {
	c.mu.Lock()
	if c.done != nil {
		if c.timer != nil {
			c.timer.Stop()
		}
		if !c.closed {
			close(c.done)
		}
		c.done, c.closed = nil, false
	}
	c.mu.Unlock()
	readCtxs.Put(c)
}

// expire closes Done when the deadline has passed. A timer that fires late,
// from an earlier use, finds the deadline of the current one ahead and does
// nothing.
func (c *readCtx) expire() {
	c.mu.Lock()
	if c.done != nil && !c.closed && !time.Now().Before(c.deadline) {
		close(c.done)
		c.closed = true
	}
	c.mu.Unlock()
}

func (c *readCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *readCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if d := time.Until(c.deadline); d <= 0 {
			close(c.done)
			c.closed = true
		} else if c.timer == nil {
			c.timer = time.AfterFunc(d, c.expire)
		} else {
			c.timer.Reset(d)
		}
	}
	return c.done
}

func (c *readCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || (c.done == nil && !time.Now().Before(c.deadline)) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *readCtx) Value(any) any { return nil }
