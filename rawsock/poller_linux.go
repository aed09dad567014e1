//go:build linux

package rawsock

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Poller waits for many sockets on one goroutine. A goroutine blocked in a
// read keeps its stack, 4 KiB at the depth of a relay's wait, and in a
// burst of thousands of requests that all wait for their first byte, or of
// thousands of streams between two events, those stacks were a quarter of
// the proxy's memory per stream (scripts/streams.sh). A wait parked here
// holds no goroutine; its goroutine goes on to other work.
//
// The poller is an epoll instance of its own, registered in the runtime's
// poller like any other descriptor, so that its goroutine waits as a
// socket read does. A socket is registered once (Register), edge-triggered,
// and stays until it is closed (Forget) or goes back to a pool idle
// (Unregister): a park is then a lock and no system call. One-shot registrations, re-armed at each park, cost a
// stream with an event every 20 ms a tenth of its CPU in epoll_ctl. An
// edge that comes while no wait is parked on its socket is kept (ready),
// and the next Park returns at once for the caller to read again: the
// bytes may have come between the caller's read and its park. Deadlines
// are the poller's own: it wakes at the earliest, and at least every tick
// while any wait is parked, to ask each waiter whether its wait must end
// (Waiter.Due).
type Poller struct {
	epfd   int
	f      *os.File
	rc     syscall.RawConn
	tick   time.Duration
	waitFn func(fd uintptr) bool

	mu     sync.Mutex
	slots  []slot
	free   int32 // the first free slot, -1 for none
	parked int
	armed  time.Time // the poller's read deadline, zero for none
	ev     unix.EpollEvent
	dead   error  // why the poller's goroutine stopped: nothing parks since
	edges  uint64 // the events collected, for tests
	// orphans are the waits parked on sockets forgotten, woken as due
	// by the poller's goroutine (sweep), so that nothing but that
	// goroutine wakes a wait or asks Due of one.
	orphans []Waiter

	// The poller's goroutine's own.
	events  [64]unix.EpollEvent
	woken   []woken
	checks  []check
	waitErr error // epoll_wait's own failure, which RawConn.Read does not return
}

// Waiter is a wait parked on a Poller.
type Waiter interface {
	// Due reports whether the wait must end though its socket has
	// nothing to read. The poller's goroutine asks at every tick, while
	// the wait is parked, outside the poller's lock: Due must not block
	// or park.
	Due() bool
	// Wake is called once, on the poller's goroutine, when the wait
	// ended: its socket had an edge (due false), or its deadline
	// passed, Due said so, or its socket was forgotten (due true). It
	// must not block: it hands the waiter's work to another goroutine.
	Wake(due bool)
}

// slot is a registered socket's.
type slot struct {
	w        Waiter // the wait parked, nil for none
	deadline time.Time
	gen      uint32 // its registration's: events carry it
	parks    uint32 // the waits parked on it so far
	next     int32  // the free list
	used     bool   // registered
	ready    bool   // an edge came while no wait was parked
	// ended is set by an edge that brought the socket's end of stream,
	// an error or urgent data: a read that filled less than its buffer
	// does not show then that no byte is left (Park's unread).
	ended bool
}

// check is a parked wait that a sweep asks Due of, outside the lock.
type check struct {
	w          Waiter
	i          int32
	gen, parks uint32
}

type woken struct {
	w   Waiter
	due bool
}

// NewPoller starts a poller whose tick is the longest that a parked wait
// goes without Due being asked.
func NewPoller(tick time.Duration) (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, os.NewSyscallError("setnonblock", err)
	}
	f := os.NewFile(uintptr(epfd), "rawsock-poller")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	p := &Poller{epfd: epfd, f: f, rc: rc, tick: tick, free: -1}
	p.waitFn = p.collect
	// Without a deadline the read below would wait for good, whether or
	// not the runtime polls the instance: a poller that cannot have one
	// is not used.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, err
	}
	go p.run()
	return p, nil
}

// Register adds the socket fd to p, for Park, and returns its handle. The
// caller calls Forget with it before it closes the socket.
func (p *Poller) Register(fd int) (int32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead != nil {
		return -1, p.dead
	}
	i := p.free
	if i < 0 {
		i = int32(len(p.slots))
		p.slots = append(p.slots, slot{next: -1})
	}
	s := &p.slots[i]
	p.free, s.next = s.next, -1
	s.gen++
	p.ev = unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLPRI | unix.EPOLLRDHUP | unix.EPOLLET, Fd: i, Pad: int32(s.gen)}
	err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &p.ev)
	if err == unix.EEXIST {
		err = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, fd, &p.ev)
	}
	if err != nil {
		s.next, p.free = p.free, i
		return -1, os.NewSyscallError("epoll_ctl", err)
	}
	s.used = true
	return i, nil
}

// Forget releases the handle of a socket about to be closed (its close
// takes it out of the epoll instance). A wait parked on it, which nothing
// should close, is woken as due, to find its socket closed.
func (p *Poller) Forget(h int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.orphan(h)
	p.release(h)
}

// Unregister is Forget for a socket that stays open (a connection going
// back to its pool): it leaves the epoll instance, so that its bytes no
// longer wake the poller.
func (p *Poller) Unregister(h int32, fd int) {
	p.mu.Lock()
	p.orphan(h)
	p.release(h)
	dead := p.dead != nil // epfd may be closed, its number another's
	p.mu.Unlock()
	if !dead {
		// Outside the lock that parks take. An edge collected meanwhile
		// names a slot released, or registered again under another
		// generation: it is dropped.
		var ev unix.EpollEvent
		unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, &ev)
	}
}

// orphan hands a wait parked on slot h, if any, to the poller's goroutine
// to wake, under mu.
func (p *Poller) orphan(h int32) {
	if w := p.slots[h].w; w != nil {
		p.unpark(h)
		p.orphans = append(p.orphans, w)
		p.arm(time.Now()) // the sweep, at once
	}
}

// release frees slot h, under mu.
func (p *Poller) release(h int32) {
	s := &p.slots[h]
	s.used, s.ready, s.ended = false, false, false
	s.next, p.free = p.free, h
}

// Park parks w on the socket of handle h until the socket has an edge
// (bytes, its end, an error), until deadline (none when zero), or until Due
// says so; Wake then tells w. It reports false, and parks nothing, when an
// edge came since the last wait on h ended: the caller reads the socket
// again. unread says that the caller did not read the socket to find it
// empty before this park, as its last read filled less than its buffer:
// Park then reports false as well once an edge brought the socket's end of
// stream, an error or urgent data, which such a read does not rule out (a
// read stops at urgent data, and the end comes with the last bytes): the
// caller's wait would be for an edge that does not come. It returns an
// error when the poller stopped. Once Park returned true,
// the caller must not touch what w's wake resumes: w may be running again
// already.
func (p *Poller) Park(h int32, w Waiter, deadline time.Time, unread bool) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead != nil {
		return false, p.dead
	}
	s := &p.slots[h]
	if s.ready || unread && s.ended {
		s.ready = false
		return false, nil
	}
	s.w, s.deadline = w, deadline
	s.parks++
	p.parked++
	switch {
	case p.armed.IsZero():
		t := time.Now().Add(p.tick)
		if !deadline.IsZero() && deadline.Before(t) {
			t = deadline
		}
		p.arm(t)
	case !deadline.IsZero() && deadline.Before(p.armed):
		p.arm(deadline)
	}
	return true, nil
}

// Parked returns the number of waits parked.
func (p *Poller) Parked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parked
}

// arm sets the poller's read deadline, under mu.
func (p *Poller) arm(t time.Time) {
	p.armed = t
	p.f.SetReadDeadline(t)
}

func (p *Poller) run() {
	for {
		err := p.rc.Read(p.waitFn)
		if err == nil && p.waitErr != nil {
			err = p.waitErr
		}
		switch {
		case err == nil:
		case os.IsTimeout(err):
			p.sweep()
		default:
			p.stop(err)
		}
		p.wake()
		if err != nil && !os.IsTimeout(err) {
			return
		}
	}
}

// wake tells the waits collected in woken that they ended, outside the
// lock.
func (p *Poller) wake() {
	for i, k := range p.woken {
		k.w.Wake(k.due)
		p.woken[i] = woken{}
	}
	p.woken = p.woken[:0]
}

// stop marks p dead, after its wait failed (it is not closed but by a
// bug), and ends every wait parked, as due: each then waits on its own
// goroutine, as Park fails from now on.
func (p *Poller) stop(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = fmt.Errorf("rawsock: the poller stopped: %w", err)
	for i, w := range p.orphans {
		p.woken = append(p.woken, woken{w: w, due: true})
		p.orphans[i] = nil
	}
	p.orphans = p.orphans[:0]
	for i := range p.slots {
		if s := &p.slots[i]; s.w != nil {
			p.woken = append(p.woken, woken{w: s.w, due: true})
			p.unpark(int32(i))
		}
	}
}

// collect is the poller's RawConn function: it takes the ready waits out
// of their slots into woken, and reports false (wait) when none was.
func (p *Poller) collect(fd uintptr) bool {
	n, err := unix.EpollWait(int(fd), p.events[:], 0)
	if n <= 0 {
		if err != nil && err != unix.EINTR && err != unix.EAGAIN {
			p.waitErr = os.NewSyscallError("epoll_wait", err)
			return true
		}
		return false
	}
	p.mu.Lock()
	p.edges += uint64(n)
	for _, e := range p.events[:n] {
		i := e.Fd
		if i < 0 || int(i) >= len(p.slots) {
			continue
		}
		s := &p.slots[i]
		switch {
		case !s.used || s.gen != uint32(e.Pad):
			// A socket forgotten since.
			continue
		case e.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR|unix.EPOLLPRI) != 0:
			s.ended = true
		}
		switch {
		case s.w != nil:
			p.woken = append(p.woken, woken{w: s.w})
			p.unpark(i)
		default:
			s.ready = true
		}
	}
	p.mu.Unlock()
	return true
}

// sweep ends the waits past their deadline and those that Due ends, and
// sets the next deadline. Due makes a system call (a client's probe), so
// the sweep asks it outside the lock, which every Park takes: with
// thousands of waits parked, their probes would hold the parks back.
func (p *Poller) sweep() {
	now := time.Now()
	p.mu.Lock()
	for i, w := range p.orphans {
		p.woken = append(p.woken, woken{w: w, due: true})
		p.orphans[i] = nil
	}
	p.orphans = p.orphans[:0]
	p.checks = p.checks[:0]
	for i := range p.slots {
		s := &p.slots[i]
		switch {
		case s.w == nil:
		case !s.deadline.IsZero() && !now.Before(s.deadline):
			p.woken = append(p.woken, woken{w: s.w, due: true})
			p.unpark(int32(i))
		default:
			p.checks = append(p.checks, check{w: s.w, i: int32(i), gen: s.gen, parks: s.parks})
		}
	}
	p.mu.Unlock()
	n := 0
	for _, c := range p.checks {
		if c.w.Due() {
			p.checks[n] = c
			n++
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.checks[:n] {
		// Still the same wait: not woken by an edge or a Forget since.
		if s := &p.slots[c.i]; s.w != nil && s.gen == c.gen && s.parks == c.parks {
			p.woken = append(p.woken, woken{w: s.w, due: true})
			p.unpark(c.i)
		}
	}
	clear(p.checks) // no waiter kept past its wait
	var next time.Time
	if p.parked > 0 {
		next = now.Add(p.tick)
		for i := range p.slots {
			if s := &p.slots[i]; s.w != nil && !s.deadline.IsZero() && s.deadline.Before(next) {
				next = s.deadline
			}
		}
	}
	p.arm(next)
}

// unpark ends the wait parked on slot i, under mu.
func (p *Poller) unpark(i int32) {
	s := &p.slots[i]
	s.w, s.deadline = nil, time.Time{}
	p.parked--
}
