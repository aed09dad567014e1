package router

import "sync"

// A stream's last data and the chunk that ends it often come from the
// replica in one read: an engine ends its stream with its last events and
// the end at once, and a proxy that falls behind finds them together. The
// relay writes them in one write (writeStream). fasthttp flushes each chunk
// it writes, and then, at the answer's end, the last chunk on its own: two
// writes where one does, and on a machine where a system call costs a
// microsecond or more, a write is a few (scripts/peers.sh, shared CPUs).
// So, where the end is buffered behind the last data, the exchange asks the
// client's connection to hold its next write (the last data's flush) and
// send it with the write after (the end's, which fasthttp makes at once,
// unless the client pipelined a request: then with that answer, as fasthttp
// holds the end itself).

// holder is a client connection that can hold one write for the next.
type holder interface {
	// holdNext makes the next Write keep its bytes, and the Write after
	// it send them first, in the same system call when it is small.
	holdNext()
}

// heldMax is the most bytes of a write that goes with held bytes in one
// write: the end of a chunked body, and its trailers. A larger one goes
// on its own, after them.
const heldMax = 1 << 10

// heldBufs are the buffers of held writes: a flush of fasthttp's 4 KiB
// writer, or a write past it of a chunk of its 4 KiB copy buffer, framed.
var heldBufs = sync.Pool{New: func() any { return &heldBuf{b: make([]byte, 0, 5<<10)} }}

type heldBuf struct{ b []byte }

func (c *coarseConn) holdNext() { c.hold = true }

// keep is Write while a hold is asked for: it copies p, as the writer
// that wrote it reuses its buffer.
func (c *coarseConn) keep(p []byte) (int, error) {
	c.hold = false
	h := heldBufs.Get().(*heldBuf)
	h.b = append(h.b[:0], p...)
	c.held = h
	return len(p), nil
}

// writeHeld writes the held bytes, and p with them.
func (c *coarseConn) writeHeld(p []byte) (int, error) {
	h := c.held
	c.held = nil
	var err error
	if len(p) <= heldMax {
		h.b = append(h.b, p...)
		_, err = c.Conn.Write(h.b)
	} else if _, err = c.Conn.Write(h.b); err == nil {
		_, err = c.Conn.Write(p)
	}
	if cap(h.b) <= 64<<10 {
		heldBufs.Put(h)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *pipelinedConn) holdNext() {
	if h, ok := c.Conn.(holder); ok {
		h.holdNext()
	}
}
