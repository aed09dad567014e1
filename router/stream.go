package router

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/upstream"
)

// stream relays a response body that is not read whole: SSE, chunked, or
// large. fasthttp calls Read from the connection's goroutine after the
// handler returns and writes each result as one chunk, flushed at once, so
// the client gets what one read from the replica gave, without delay.
//
// A Read that fails returns a non-EOF error: fasthttp then closes the client
// connection without the terminating chunk, and the client sees a truncated
// stream as an error, never as a clean end.
type stream struct {
	h      *Handler
	c      *upstream.Conn
	r      *upstream.Replica
	client net.Conn
	reason Reason
	status int
	start  time.Time

	chunked   bool
	untilEOF  bool  // no framing: the body ends when the replica closes
	left      int64 // bytes left in this chunk, or in the body when not chunked
	afterData bool  // a chunk's data was read; its CRLF comes next
	done      bool
	fault     upstream.Fault
	err       error
}

var streamPool = sync.Pool{New: func() any { return new(stream) }}

func acquireStream(h *Handler, c *upstream.Conn, r *upstream.Replica, ctx *fasthttp.RequestCtx, reason Reason, status int, start time.Time) *stream {
	s := streamPool.Get().(*stream)
	*s = stream{h: h, c: c, r: r, client: ctx.Conn(), reason: reason, status: status, start: start, fault: upstream.OK}
	switch cl := ctx.Response.Header.ContentLength(); {
	case cl == -1:
		s.chunked = true
	case cl < 0:
		s.untilEOF = true
		s.left = -1
	default:
		s.left = int64(cl)
	}
	return s
}

// errStreamCut is what the client's connection is closed with when the
// replica's stream broke.
var errStreamCut = errors.New("replica stream cut")

func (s *stream) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n := 0
	for n < len(p) && !s.done {
		if s.chunked && s.left == 0 {
			if n > 0 && !s.lineBuffered() {
				break // send what we have; the next chunk may be slow
			}
			if s.afterData {
				// The CRLF that ends a chunk's data.
				line, err := s.line()
				if err != nil {
					return n, s.failed(err)
				}
				if len(line) != 0 {
					return n, s.failed(errBadChunk)
				}
				s.afterData = false
				continue
			}
			if err := s.nextChunk(); err != nil {
				return n, s.failed(err)
			}
			continue
		}
		if s.c.Reader.Buffered() == 0 {
			if n > 0 {
				break
			}
			if err := s.c.Await(s.client); err != nil {
				if s.untilEOF && err == io.ErrUnexpectedEOF {
					s.done = true
					break
				}
				return n, s.failed(err)
			}
		}
		m := min(s.c.Reader.Buffered(), len(p)-n)
		if s.left >= 0 && int64(m) > s.left {
			m = int(s.left)
		}
		m, _ = s.c.Reader.Read(p[n : n+m])
		n += m
		if s.left >= 0 {
			s.left -= int64(m)
			if !s.chunked && s.left == 0 {
				s.done = true
			}
		}
	}
	if s.done && n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// lineBuffered reports whether a whole line is already buffered, so that
// parsing it cannot block.
func (s *stream) lineBuffered() bool {
	b, _ := s.c.Reader.Peek(s.c.Reader.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

var errBadChunk = errors.New("malformed chunked encoding from replica")

// nextChunk reads the next chunk's size line; a zero size ends the body
// after its trailers.
func (s *stream) nextChunk() error {
	line, err := s.line()
	if err != nil {
		return err
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 || len(line) > 15 {
		return errBadChunk
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
			return errBadChunk
		}
	}
	if size > 0 {
		s.left, s.afterData = size, true
		return nil
	}
	for { // trailers, dropped, up to the empty line
		line, err := s.line()
		if err != nil {
			return err
		}
		if len(line) == 0 {
			s.done = true
			return nil
		}
	}
}

func (s *stream) line() ([]byte, error) {
	if err := s.c.Await(s.client); err != nil {
		return nil, err
	}
	s.c.SetReadDeadline(time.Now().Add(s.h.set.Config().ResponseTimeout))
	line, err := s.c.Reader.ReadSlice('\n')
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), nil
}

func (s *stream) failed(err error) error {
	s.c.MarkBroken()
	s.fault = upstream.Classify(upstream.PhaseStream, true, err)
	if s.fault == upstream.ClientGone {
		s.err = upstream.ErrClientGone
	} else {
		s.err = errStreamCut
		if ok, held := s.r.CutLog.Allow(time.Now()); ok {
			s.h.log.Warn("replica stream cut; the client sees a truncated stream", "replica", s.r.Name, "cause", err.Error(), "suppressed", held)
		}
	}
	return s.err
}

// CloseWithError is called by fasthttp once the response is written or
// abandoned; writeErr is the error writing to the client, if any.
func (s *stream) CloseWithError(writeErr error) error {
	fault := s.fault
	if fault == upstream.OK && !s.done {
		// fasthttp stopped reading: the client went away.
		fault = upstream.ClientGone
	}
	s.h.finish(s.c, s.r, s.reason, s.status, fault, s.start)
	*s = stream{}
	streamPool.Put(s)
	return nil
}
