package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

// streamState is an exchange's relay of a response body that is not read
// whole: SSE, chunked, or large. fasthttp calls Read from the connection's
// goroutine after the handler returns and writes each result as one chunk,
// flushed at once, so the client gets what one read from the replica gave,
// without delay. Trailers of a chunked answer are read into the response
// header, and fasthttp writes them after the last chunk.
//
// A Read that fails returns a non-EOF error: fasthttp then closes the client
// connection without the terminating chunk, and the client sees a truncated
// stream as an error, never as a clean end.
type streamState struct {
	chunked   bool
	untilEOF  bool  // no framing: the body ends when the replica closes
	left      int64 // bytes left in this chunk, or in the body when not chunked
	afterData bool  // a chunk's data was read; its CRLF comes next
	done      bool
	active    bool      // counted in the replica's streams
	written   time.Time // when the client's write deadline was last moved
	sent      int64     // body bytes relayed, for the access log
	idSeen    bool      // a Responses stream's id was recorded
	pin       bool      // Served is due at the first data
	kept      int64     // bytes written to the exchange's tail (keepTail)
	// clientChunked and closeAfter are a relayed stream's (relay.go):
	// its body goes to the client in chunks, and the connection closes
	// after it.
	clientChunked, closeAfter bool
	// endInData is set where fasthttp writes the stream: a Read that
	// leaves the replica's end buffered has the client's connection end
	// the body in the write of that data (lastchunk.go).
	endInData bool
	result    upstream.Result
	err       error
}

// startStream sets x up to relay a body of length cl (-1 chunked, -2 until
// the replica closes).
func (x *exchange) startStream(cl int) {
	s := &x.stream
	*s = streamState{result: upstream.OK, active: true}
	x.h.streams.Add(1)
	x.r.BeginStream()
	switch {
	case cl == -1:
		s.chunked = true
	case cl < 0:
		s.untilEOF = true
		s.left = -1
	default:
		s.left = int64(cl)
		s.done = cl == 0
	}
}

// errStreamCut is what the client's connection is closed with when the
// replica's stream broke.
var errStreamCut = errors.New("replica stream cut")

func (x *exchange) Read(p []byte) (int, error) {
	s, c := &x.stream, x.c
	if s.err != nil {
		return 0, s.err
	}
	// fasthttp set the client's write deadline once for the whole answer:
	// a stream that flows moves it on, so that only a client that stops
	// reading for the write timeout is cut.
	if t := x.h.writeTimeout; t > 0 {
		if now := x.clock(); now.Sub(s.written) > t/4 {
			// The deadline from the wall clock's own reading: the
			// client's coarse deadlines keep only its wall time, which
			// x.clock's does not follow if the system clock is set.
			x.client.SetWriteDeadline(time.Now().Add(t))
			s.written = now
		}
	}
	n := 0
	for n < len(p) && !s.done {
		if s.chunked {
			var err error
			if n, err = x.relayChunks(p, n); err != nil {
				return n, x.failed(err)
			}
			if n == len(p) {
				break
			}
		}
		if s.chunked && s.left == 0 {
			// relayChunks stopped at a line not buffered whole, or at the
			// last chunk's: what we have goes first, and the line is
			// read here, with a wait if need be.
			if n > 0 {
				break
			}
			line, err := x.line()
			if err != nil {
				return n, x.failed(err)
			}
			if s.afterData {
				// The CRLF that ends a chunk's data.
				if len(line) != 0 {
					return n, x.failed(errBadChunk)
				}
				s.afterData = false
				continue
			}
			if err := x.chunkHeader(line); err != nil {
				return n, x.failed(err)
			}
			continue
		}
		if c.Reader.Buffered() == 0 {
			if n > 0 {
				break
			}
			if err := x.awaitData(); err != nil {
				return n, err
			}
			if s.done {
				break
			}
		}
		m := min(c.Reader.Buffered(), len(p)-n)
		if s.left >= 0 && int64(m) > s.left {
			m = int(s.left)
		}
		m, _ = c.Reader.Read(p[n : n+m])
		n += m
		if s.left >= 0 {
			s.left -= int64(m)
			if !s.chunked && s.left == 0 {
				s.done = true
			}
		}
	}
	if x.responses && !s.idSeen && n > 0 && s.sent < responseIDWithin {
		x.recordStreamedID(p[:n])
	}
	if n > 0 {
		x.keepTail(p[:n]) // where the usage is, read when it ends (usage.go)
		x.unqueue()       // the first token came: the prefill is done
		if x.stream.pin {
			x.stream.pin = false
			x.served()
		}
	}
	s.sent += int64(n)
	if s.done && n == 0 {
		return 0, io.EOF
	}
	if s.endInData && n > 0 && x.endBuffered() {
		if e, ok := x.client.(ender); ok {
			e.endAfter(p[:n])
		}
	}
	return n, nil
}

// endBuffered reports whether what is buffered next of a chunked body is
// its end, the last chunk without trailers, whole: the next Read returns
// io.EOF without a wait.
func (x *exchange) endBuffered() bool {
	s, r := &x.stream, x.c.Reader
	if !s.chunked || s.left != 0 || s.afterData || r.Buffered() < len(endChunk) {
		return false
	}
	b, _ := r.Peek(len(endChunk))
	return bytes.Equal(b, endChunk)
}

// awaitData waits for the replica's next bytes. The end of a body that
// runs until the replica closes marks the stream done; any other failure
// is the stream's error (failed).
func (x *exchange) awaitData() error {
	return x.dataCame(x.c.AwaitMore(x.client, upstream.PhaseStream))
}

// awaitDataParked is awaitData for a relay, parked (awaitParked): it
// reports true when x is parked.
func (x *exchange) awaitDataParked() bool {
	if x.park.start.IsZero() {
		x.park.start = time.Now()
	}
	err := x.awaitParked(upstream.PhaseStream, x.park.start)
	if err == errParked {
		return true
	}
	x.park.start = time.Time{}
	x.dataCame(err)
	return false
}

// dataCame is awaitData's verdict on its wait's error.
func (x *exchange) dataCame(err error) error {
	if err != nil && x.stream.untilEOF && errors.Is(err, io.ErrUnexpectedEOF) {
		x.stream.done = true
		return nil
	}
	if err != nil {
		return x.failed(err)
	}
	return nil
}

// relayChunks copies into p[n:] the data of the chunks that are buffered
// whole or in part, reading their framing in place, and returns the new n.
// It stops at a line that is not buffered whole and at the last chunk's
// size line, which Read's general path reads (with a wait, and the
// trailers). A stream's events come a chunk each, and several are often
// buffered at once: their framing costs a search and a copy each here, a
// Peek, a Discard and a bufio read each through the Reader.
func (x *exchange) relayChunks(p []byte, n int) (int, error) {
	s, r := &x.stream, x.c.Reader
	b, _ := r.Peek(r.Buffered())
	pos := 0
	for n < len(p) {
		if s.left > 0 {
			m := int(min(int64(len(b)-pos), int64(len(p)-n), s.left))
			if m == 0 {
				break
			}
			copy(p[n:], b[pos:pos+m])
			n, pos, s.left = n+m, pos+m, s.left-int64(m)
			continue
		}
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			break
		}
		line := trimEOL(b[pos : pos+i+1])
		if s.afterData {
			// The CRLF that ends a chunk's data.
			if len(line) != 0 {
				r.Discard(pos)
				return n, errBadChunk
			}
			pos += i + 1
			s.afterData = false
			continue
		}
		size, err := chunkSize(line)
		if err != nil {
			r.Discard(pos)
			return n, err
		}
		if size == 0 {
			break // the last chunk: its trailers may take a wait
		}
		pos += i + 1
		s.left, s.afterData = size, true
	}
	r.Discard(pos)
	return n, nil
}

// dataBuffered reports whether the body's first Read returns bytes without
// waiting for the replica: some are buffered, after a whole and valid size
// line of a chunk that is not the last when the body is chunked (a last
// chunk's trailers may take the replica a while, and a malformed line cuts
// the stream, which the client should see after the head).
func (x *exchange) dataBuffered() bool {
	b, _ := x.c.Reader.Peek(x.c.Reader.Buffered())
	if !x.stream.chunked {
		return len(b) > 0
	}
	i := bytes.IndexByte(b, '\n')
	if i < 0 || i+1 == len(b) {
		return false
	}
	size, err := chunkSize(b[:i])
	return err == nil && size > 0
}

var errBadChunk = errors.New("malformed chunked encoding from replica")

// chunkSize reads a chunk's size line (its extensions and line end too).
func chunkSize(line []byte) (int64, error) {
	// The common line, hex digits alone, in one pass.
	if len(line) > 0 && len(line) <= 15 {
		var size int64
		for _, c := range line {
			v := unhex[c]
			if v < 0 {
				return chunkSizeSlow(line)
			}
			size = size<<4 | int64(v)
		}
		return size, nil
	}
	return chunkSizeSlow(line)
}

// unhex is the value of each hex digit, -1 for any other byte.
var unhex = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = int8(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = int8(c - 'a' + 10)
		t[c-'a'+'A'] = int8(c - 'a' + 10)
	}
	return t
}()

// chunkSizeSlow is chunkSize for a line with extensions, white space or
// an error.
func chunkSizeSlow(line []byte) (int64, error) {
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 || len(line) > 15 {
		return 0, errBadChunk
	}
	var size int64
	for _, c := range line {
		switch {
		case c >= '0' && c <= '9':
			size = size<<4 | int64(c-'0')
		case c >= 'a' && c <= 'f':
			size = size<<4 | int64(c-'a'+10)
		case c >= 'A' && c <= 'F':
			size = size<<4 | int64(c-'A'+10)
		default:
			return 0, errBadChunk
		}
	}
	return size, nil
}

// chunkHeader reads a chunk's size line; a zero size ends the body, and
// the trailers that follow it go into the response header.
func (x *exchange) chunkHeader(line []byte) error {
	size, err := chunkSize(line)
	if err != nil {
		return err
	}
	if size > 0 {
		x.stream.left, x.stream.afterData = size, true
		return nil
	}
	if err := x.c.AwaitMore(x.client, upstream.PhaseStream); err != nil {
		return err
	}
	x.c.PrepareHead()
	if err := x.trailers().ReadTrailer(x.c.Reader); err != nil {
		if isReadError(err) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		// Malformed or forbidden trailers: the body is whole, so it
		// ends cleanly without them, and the connection, with their
		// bytes unread, is not reused.
		x.c.MarkBroken()
		x.h.log.Debug("replica sent malformed trailers; dropped", "replica", x.r.Name, "cause", err.Error())
	}
	x.stream.done = true
	return nil
}

// isReadError reports whether err is a failure to read (end of stream, a
// timeout, a socket error) rather than bytes that could not be parsed.
func isReadError(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) || isTimeout(err)
}

// trailers is where a stream's trailers are read: its response header,
// or, for a relayed stream, whose ctx is fasthttp's again, x's own.
func (x *exchange) trailers() *fasthttp.ResponseHeader {
	if !x.relayed {
		return &x.ctx.Response.Header
	}
	hd := x.ownHeader()
	hd.Reset()
	return hd
}

// ownHeader is x's own response header, made once for the pooled x.
func (x *exchange) ownHeader() *fasthttp.ResponseHeader {
	if x.relayHeader == nil {
		x.relayHeader = new(fasthttp.ResponseHeader)
	}
	return x.relayHeader
}

func (x *exchange) line() ([]byte, error) {
	if err := x.c.AwaitMore(x.client, upstream.PhaseStream); err != nil {
		return nil, err
	}
	x.c.PrepareLine()
	line, err := x.c.Reader.ReadSlice('\n')
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return trimEOL(line), nil
}

// trimEOL is bytes.TrimRight(line, "\r\n") without its cutset's setup, a
// call per chunk line.
func trimEOL(line []byte) []byte {
	n := len(line)
	for n > 0 && (line[n-1] == '\n' || line[n-1] == '\r') {
		n--
	}
	return line[:n]
}

func (x *exchange) failed(err error) error {
	s := &x.stream
	e := x.c.Fail(upstream.PhaseStream, err).(*upstream.Error)
	s.result = upstream.Judge(e).Result
	switch {
	case s.result == upstream.ClientGone:
		s.err = upstream.ErrClientGone
	case x.h.cutting.Load():
		s.err = errStreamCut
		x.h.log.Debug("stream cut by the drain's deadline", "replica", x.r.Name, "cause", e.Error())
	default:
		s.err = errStreamCut
		if ok, held := x.r.CutLog.Allow(time.Now()); ok {
			x.h.log.Warn("replica stream cut; the client sees a truncated stream", "replica", x.r.Name, "cause", e.Error(), "suppressed", held)
		}
	}
	return s.err
}

// CloseWithError is called by fasthttp once the response is written or
// abandoned; writeErr is the error writing to the client, if any.
func (x *exchange) CloseWithError(writeErr error) error {
	res := x.stream.result
	if x.stream.pin && res == upstream.OK && x.stream.done {
		x.served() // a whole stream without data
	}
	if res == upstream.OK && (!x.stream.done || writeErr != nil) {
		// fasthttp stopped reading, or the write of the last data,
		// which carried the end (lastchunk.go, writeStream), failed:
		// the client went away, or stopped reading for the write
		// timeout. (An end written on its own, after this, fails
		// unseen, as before.)
		res = upstream.ClientGone
		if isTimeout(writeErr) {
			x.h.log.Debug("client stopped reading a stream; cut after the write timeout", "client", x.client.RemoteAddr().String(), "replica", x.r.Name)
		}
	}
	x.finish(res)
	releaseExchange(x)
	return nil
}
