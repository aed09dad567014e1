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
	// endAfter says that the next write ends with the chunk of data
	// (data, then CRLF), the body's last, and that the body ends there:
	// fasthttp's end is "0\r\n\r\n", the answer declaring no trailer.
	endAfter(data []byte)
}

// endChunk ends a chunked body that has no trailers.
var endChunk = []byte(lastChunk[2:])

// endBufs hold a last chunk's write with the end: a flush of fasthttp's
// 4 KiB writer.
var endBufs = sync.Pool{New: func() any { return &endBuf{b: make([]byte, 0, 4<<10+len(endChunk))} }}

type endBuf struct{ b []byte }

func (c *coarseConn) endAfter(data []byte) { c.end = data }

// writeEnd is Write while the end is due: after the write of the last
// chunk, with the end appended, or in fasthttp's writer's next write,
// dropped. That write comes at the answer's end, or, where the client
// pipelined a request, with its answer; a 103 that fasthttp writes for it
// meanwhile, through a writer of its own, goes as it is.
func (c *coarseConn) writeEnd(p []byte) (int, error) {
	if c.endSent {
		if !bytes.HasPrefix(p, endChunk) {
			c.endSent = false
			n, err := c.Write(p)
			c.endSent = true
			return n, err
		}
		c.endSent = false
		if len(p) == len(endChunk) {
			return len(p), nil
		}
		n, err := c.Write(p[len(endChunk):])
		return n + len(endChunk), err
	}
	data := c.end
	c.end = nil
	if !endsWithChunk(p, data) {
		// The chunk went in two writes, past the writer's buffer: the
		// end goes on its own.
		return c.Write(p)
	}
	b := endBufs.Get().(*endBuf)
	b.b = append(append(b.b[:0], p...), endChunk...)
	n, err := c.Write(b.b)
	if cap(b.b) <= 64<<10 {
		endBufs.Put(b)
	}
	if err != nil {
		return min(n, len(p)), err
	}
	c.endSent = true
	return len(p), nil
}

// endsWithChunk reports whether p, the write that follows the Read of the
// body's last data, is the flush that ends that data's chunk: one that
// ends with data and the CRLF after it. fasthttp's writer writes before its
// flush only what does not fit: a full buffer (part of a chunk, whose tail
// the data's bytes could match by chance), or, with nothing buffered, a
// caller's bytes larger than the buffer (the data alone). A write shorter
// than the buffer is neither.
func endsWithChunk(p, data []byte) bool {
	i := len(p) - len(data) - 2
	return len(p) < writeBuffer && i >= 0 && p[len(p)-2] == '\r' && p[len(p)-1] == '\n' && bytes.Equal(p[i:i+len(data)], data)
}

func (c *pipelinedConn) endAfter(data []byte) {
	if e, ok := c.Conn.(ender); ok {
		e.endAfter(data)
	}
}
