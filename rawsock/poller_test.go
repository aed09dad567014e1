//go:build linux

package rawsock

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// waiter is a Waiter whose wake is sent on a channel.
type waiter struct {
	due  atomic.Bool
	woke chan bool
}

func newWaiter() *waiter { return &waiter{woke: make(chan bool, 1)} }

func (w *waiter) Due() bool     { return w.due.Load() }
func (w *waiter) Wake(due bool) { w.woke <- due }

// fdOf returns c's socket.
func fdOf(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	rc.Control(func(s uintptr) { fd = int(s) })
	return fd
}

// park is p.Park that fails the test on an error.
func park(t *testing.T, p *Poller, h int32, w Waiter, deadline time.Time) bool {
	t.Helper()
	parked, err := p.Park(h, w, deadline, false)
	if err != nil {
		t.Fatal(err)
	}
	return parked
}

// register registers one end of a new loopback connection with p, and
// returns its handle and the other end.
func register(t *testing.T, p *Poller) (int32, *net.TCPConn) {
	t.Helper()
	nc, peer := tcpPair(t)
	h, err := p.Register(fdOf(t, nc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Forget(h) })
	return h, peer
}

// edgeKept reports whether an edge of handle h's socket came while no
// wait was parked on it.
func (p *Poller) edgeKept(h int32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slots[h].ready
}

// wait waits for w's wake and returns its due.
func (w *waiter) wait(t *testing.T) bool {
	t.Helper()
	select {
	case due := <-w.woke:
		return due
	case <-time.After(10 * time.Second):
		t.Fatal("no wake within 10 s")
		return false
	}
}

// A parked wait wakes once for each of the ways it ends: its socket's
// bytes, its end, its deadline, and its waiter's Due; a wait parked after
// the socket had an edge is not parked (Park false), and an edge of a
// socket forgotten and registered again under the same handle does not
// reach the new wait.
func TestPoller(t *testing.T) {
	p, err := NewPoller(20 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("bytes", func(t *testing.T) {
		h, peer := register(t, p)
		w := newWaiter()
		if !park(t, p, h, w, time.Now().Add(time.Minute)) {
			t.Fatal("Park false on a socket with no edge")
		}
		select {
		case <-w.woke:
			t.Fatal("woken before any byte came")
		case <-time.After(50 * time.Millisecond): // a few ticks
		}
		peer.Write([]byte("x"))
		if due := w.wait(t); due {
			t.Fatal("woken as due, want for the byte")
		}
		if n := p.Parked(); n != 0 {
			t.Fatalf("%d parked after the wake, want 0", n)
		}
	})
	t.Run("end of stream", func(t *testing.T) {
		h, peer := register(t, p)
		w := newWaiter()
		park(t, p, h, w, time.Time{})
		peer.Close()
		if due := w.wait(t); due {
			t.Fatal("woken as due, want for the end")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		h, _ := register(t, p)
		w := newWaiter()
		start := time.Now()
		park(t, p, h, w, start.Add(100*time.Millisecond))
		if due := w.wait(t); !due {
			t.Fatal("woken for its socket, want as due")
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Fatalf("woken %v after parking, before its deadline", d)
		}
	})
	t.Run("due", func(t *testing.T) {
		h, _ := register(t, p)
		w := newWaiter()
		park(t, p, h, w, time.Time{})
		w.due.Store(true)
		if due := w.wait(t); !due {
			t.Fatal("woken for its socket, want as due")
		}
	})
	t.Run("edge before the park", func(t *testing.T) {
		h, peer := register(t, p)
		peer.Write([]byte("x"))
		deadline := time.Now().Add(10 * time.Second)
		for !p.edgeKept(h) {
			if time.Now().After(deadline) {
				t.Fatal("the byte's edge never reached the poller")
			}
			time.Sleep(time.Millisecond)
		}
		w := newWaiter()
		if park(t, p, h, w, time.Time{}) {
			t.Fatal("parked after an edge that came while none was")
		}
		if !park(t, p, h, w, time.Now().Add(50*time.Millisecond)) {
			t.Fatal("not parked the second time: the edge was kept twice")
		}
		if due := w.wait(t); !due {
			t.Fatal("woken for its socket with no new byte, want as due")
		}
	})
	t.Run("end with the bytes", func(t *testing.T) {
		// The end came with the last bytes, in the edge that woke the
		// wait, or while none was parked: a caller that read those
		// bytes, and took the socket for empty of more, parks without
		// reading again (unread); the end is not an edge any more.
		// A caller that read and found nothing parks: it read the end
		// or an error, if there was one, and a socket whose error a
		// read took, or whose urgent byte it read, does not wait for
		// nothing in a loop of parks that return at once.
		h, peer := register(t, p)
		peer.Write([]byte("x"))
		peer.Close()
		deadline := time.Now().Add(10 * time.Second)
		for !p.ended(h) {
			if time.Now().After(deadline) {
				t.Fatal("the end's edge never reached the poller")
			}
			time.Sleep(time.Millisecond)
		}
		w := newWaiter()
		for i := range 3 {
			if parked, err := p.Park(h, w, time.Now().Add(time.Minute), true); parked || err != nil {
				t.Fatalf("park %d, unread: %v, %v; want false on a socket whose end came", i+1, parked, err)
			}
		}
		if !park(t, p, h, w, time.Now().Add(50*time.Millisecond)) {
			t.Fatal("not parked after a read, on a socket whose end came")
		}
		if due := w.wait(t); !due {
			t.Fatal("woken for its socket with no new edge, want as due")
		}
	})
	t.Run("forgotten", func(t *testing.T) {
		a, peerA := tcpPair(t)
		h, _ := p.Register(fdOf(t, a))
		p.Forget(h)
		b, _ := tcpPair(t)
		h2, err := p.Register(fdOf(t, b))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Forget(h2)
		if h2 != h {
			t.Fatalf("handle %d after forgetting %d, want it again", h2, h)
		}
		w := newWaiter()
		if !park(t, p, h2, w, time.Now().Add(100*time.Millisecond)) {
			t.Fatal("Park false on a new socket")
		}
		peerA.Write([]byte("x")) // a's registration is still there: a is open
		if due := w.wait(t); !due {
			t.Fatal("woken by the forgotten socket's byte")
		}
	})
}

// ended reports whether an edge brought the end of handle h's socket.
func (p *Poller) ended(h int32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slots[h].ended
}

// edgeCount returns the events that p collected so far.
func (p *Poller) edgeCount() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.edges
}

// A socket unregistered (a connection back in its pool) no longer wakes
// the poller; one forgotten while a wait is parked on it wakes that wait,
// as due.
func TestPollerUnregisterAndForget(t *testing.T) {
	p, err := NewPoller(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, peer := tcpPair(t)
	fd := fdOf(t, nc)
	h, err := p.Register(fd)
	if err != nil {
		t.Fatal(err)
	}
	p.Unregister(h, fd)
	before := p.edgeCount()
	peer.Write([]byte("x"))
	// A second socket's byte, registered after, orders the poller's
	// collection: on Linux loopback delivers the two bytes in the order
	// they were written and epoll's ready list is first in, first out,
	// so once the second's wake came, the first byte's edge would have
	// been collected with or before it.
	h2, peer2 := register(t, p)
	w := newWaiter()
	park(t, p, h2, w, time.Time{})
	peer2.Write([]byte("y"))
	w.wait(t)
	if got := p.edgeCount() - before; got != 1 {
		t.Fatalf("%d edges collected after the unregistered socket's byte and the other's, want 1", got)
	}

	h3, _ := register(t, p)
	w3 := newWaiter()
	park(t, p, h3, w3, time.Time{})
	p.Forget(h3)
	if due := w3.wait(t); !due {
		t.Fatal("a wait on a forgotten socket woken as for a byte, want as due")
	}
}

// A poller whose wait fails ends every wait parked, as due, and parks no
// more.
func TestPollerStopped(t *testing.T) {
	p, err := NewPoller(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := register(t, p)
	w := newWaiter()
	park(t, p, h, w, time.Time{})
	p.f.Close()
	if due := w.wait(t); !due {
		t.Fatal("woken as for a byte, want as due")
	}
	if parked, err := p.Park(h, newWaiter(), time.Time{}, false); parked || err == nil {
		t.Fatalf("Park on a stopped poller: %v, %v; want false and an error", parked, err)
	}
	if _, err := p.Register(fdOf(t, func() *net.TCPConn { c, _ := tcpPair(t); return c }())); err == nil {
		t.Fatal("Register on a stopped poller: no error")
	}
}

// A park and its wake allocate nothing: a stream parks once an event.
func TestParkAllocatesNothing(t *testing.T) {
	p, err := NewPoller(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, peer := tcpPair(t)
	h, err := p.Register(fdOf(t, nc))
	if err != nil {
		t.Fatal(err)
	}
	w, b := newWaiter(), make([]byte, 1)
	deadline := time.Now().Add(time.Hour)
	allocs := testing.AllocsPerRun(100, func() {
		if park(t, p, h, w, deadline) {
			peer.Write(b)
			<-w.woke // not wait's timer, which allocates
		}
		nc.Read(b)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations a park and wake, want 0", allocs)
	}
}
