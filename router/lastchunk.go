package router

import (
	"bytes"
	"sync"
)

// A stream's last data and the chunk that ends it often come from the
// replica in one read: an engine ends its stream with its last events and
// the end at once, and a proxy that falls behind finds them together. The
// relay writes them in one write (writeStream). fasthttp flushes each chunk
// it writes, and the last chunk at the answer's end, in a write of its own:
// two system calls where one does, and on a machine where a system call
// costs a microsecond or more a write costs a few (scripts/peers.sh, shared
// CPUs). So where the replica's end is buffered behind the last data, the
// exchange tells the client's connection what that data is (endAfter); the
// connection's write that carries its whole chunk carries the last chunk
// too, and the last chunk that fasthttp writes next is dropped. A write
// that fails fails as the data's did; a client that pipelined a request
// gets the end at once, not with the next answer.

// ender is a client connection that can end a chunked body in the write of
// its last data.
type ender interface {
	// endAfter says that data is the body's last, whose chunk fasthttp
	// writes next (in one write, or, past its buffer, in two), and that
	// the body ends there: fasthttp's end is "0\r\n\r\n", the answer
	// declaring no trailer.
	endAfter(data []byte)
}

// endChunk ends a chunked body that has no trailers.
var endChunk = []byte(lastChunk[2:])

// endBufs hold a last chunk's write with the end: a flush of fasthttp's
// 4 KiB writer.
var endBufs = sync.Pool{New: func() any { return &endBuf{b: make([]byte, 0, 4<<10+len(endChunk))} }}

type endBuf struct{ b []byte }

func (c *coarseConn) endAfter(data []byte) { c.end = data }

// writeEnd is Write while the end is due. In the write that ends the last
// chunk, the end is appended. fasthttp's own end, at the head of its
// writer's next write, is dropped: that write comes at the answer's end,
// or, where the client pipelined a request, with its answer; a 103 that
// fasthttp writes for it meanwhile, through a writer of its own, goes as
// it is, and the drop waits. Both can fall in one write: a pipelined
// stream's last chunk behind the previous stream's end.
func (c *coarseConn) writeEnd(p []byte) (int, error) {
	dropped := 0
	if c.endSent && bytes.HasPrefix(p, endChunk) {
		c.endSent, dropped = false, len(endChunk)
	}
	q := p[dropped:]
	if data := c.end; data != nil {
		c.end = nil
		// Whether the write is the chunk's flush is told by the whole
		// write's length, the dropped end in it (endsWithChunk).
		if len(p) < writeBuffer && endsWithChunk(q, data) {
			b := endBufs.Get().(*endBuf)
			b.b = append(append(b.b[:0], q...), endChunk...)
			n, err := c.send(b.b)
			endBufs.Put(b)
			if err != nil {
				return min(dropped+n, len(p)), err
			}
			c.endSent = true
			return len(p), nil
		}
		// The chunk went in two writes, past the writer's buffer: the
		// end goes on its own.
	}
	if len(q) == 0 {
		return len(p), nil
	}
	n, err := c.send(q)
	return dropped + n, err
}

// endsWithChunk reports whether p, what fasthttp's writer writes next
// after the Read of the body's last data, ends with data and the CRLF
// after it. That is the flush that ends the data's chunk when the write
// is shorter than the writer's buffer (writeBuffer, which Handler.Server
// sets): before its flush the writer writes only what does not fit, a
// full buffer (part of a chunk, whose tail the data's bytes could match by
// chance), or, with nothing buffered, a caller's bytes larger than the
// buffer (the data alone); the caller checks the length.
func endsWithChunk(p, data []byte) bool {
	i := len(p) - len(data) - 2
	return i >= 0 && p[len(p)-2] == '\r' && p[len(p)-1] == '\n' && bytes.Equal(p[i:i+len(data)], data)
}

func (c *pipelinedConn) endAfter(data []byte) {
	if e, ok := c.Conn.(ender); ok {
		e.endAfter(data)
	}
}
