package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Body reads an answer's body as it comes, for a stream: it undoes the
// replica's chunked framing (the client's connection frames it again), and
// returns from each Read what one read from the replica gave, so that an
// event reaches the client without delay. A chunked answer's trailers are
// read into the header given to Stream.
type Body struct {
	c         *Conn
	client    net.Conn
	trailers  *fasthttp.ResponseHeader
	chunked   bool
	untilEOF  bool  // no framing: the body ends when the replica closes
	left      int64 // bytes left in this chunk, or in the body when not chunked
	afterData bool  // a chunk's data was read; its CRLF comes next
	done      bool
	// mark is when the stream last kept StreamMinRate (its start at
	// first), and got the bytes read since: the next wait ends
	// StreamIdleTimeout after mark unless got makes the rate by then.
	mark time.Time
	got  int64
}

// Stream returns c's answer's body, of length cl as fasthttp's
// ContentLength gives it (-1 chunked, -2 until the replica closes), to be
// read as it comes. client, if not nil, is polled while the replica is
// silent; trailers receives a chunked body's trailers.
func (c *Conn) Stream(cl int, client net.Conn, trailers *fasthttp.ResponseHeader) *Body {
	b := &c.body
	*b = Body{c: c, client: client, trailers: trailers}
	c.streamed = cl == -1
	switch {
	case cl == -1:
		b.chunked = true
	case cl < 0:
		b.untilEOF, b.left = true, -1
	default:
		b.left = int64(cl)
		b.done = cl == 0
	}
	return b
}

var errBadChunk = errors.New("malformed chunked encoding from replica")

// Read reads the body's next bytes into p, waiting for them if none are
// buffered. At the body's end it returns io.EOF; any other error is an
// *Error in PhaseStream, and c is not reused.
func (b *Body) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && !b.done {
		if b.chunked {
			var err error
			if n, err = b.copyChunks(p, n); err != nil {
				return n, b.c.fail(PhaseStream, err)
			}
			if n == len(p) {
				break
			}
			if b.left == 0 {
				// A line not buffered whole, or the last chunk's: what
				// we have goes first, and the line is read here.
				if n > 0 {
					break
				}
				if err := b.readLine(); err != nil {
					return 0, err
				}
				continue
			}
		}
		if b.c.br.Buffered() == 0 {
			if n > 0 {
				break
			}
			if err := b.wait(); err != nil {
				if b.untilEOF && errors.Is(err, io.ErrUnexpectedEOF) {
					b.done = true
					break
				}
				return 0, err
			}
		}
		m := min(b.c.br.Buffered(), len(p)-n)
		if b.left >= 0 && int64(m) > b.left {
			m = int(b.left)
		}
		m, _ = b.c.br.Read(p[n : n+m])
		n += m
		if b.left >= 0 {
			b.left -= int64(m)
			if !b.chunked && b.left == 0 {
				b.done = true
			}
		}
	}
	b.got += int64(n)
	if b.done && n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Ready reports whether the body's next Read returns bytes without waiting
// for the replica: some are buffered, after a whole and valid size line of
// a chunk that is not the last when the body is chunked.
func (b *Body) Ready() bool {
	buf, _ := b.c.br.Peek(b.c.br.Buffered())
	if !b.chunked {
		return len(buf) > 0
	}
	i := bytes.IndexByte(buf, '\n')
	if i < 0 || i+1 == len(buf) {
		return false
	}
	size, err := chunkSize(trimEOL(buf[:i]))
	return err == nil && size > 0
}

// wait waits for the replica's next bytes: StreamIdleTimeout from the
// last time the stream kept StreamMinRate (with no minimum rate, from
// now), and never past ResponseTimeout.
func (b *Body) wait() *Error {
	cfg := &b.c.r.set.cfg
	now := time.Now()
	if b.mark.IsZero() || b.got >= int64(cfg.StreamMinRate)*int64(cfg.StreamIdleTimeout)/int64(time.Second) {
		b.mark, b.got = now, 0
	}
	timeout, cause := cfg.StreamIdleTimeout-now.Sub(b.mark), ErrTimeout
	if b.got > 0 {
		cause = ErrTooSlow // bytes came, too few of them
	}
	if !b.c.until.IsZero() && b.c.until.Sub(now) < timeout {
		timeout, cause = b.c.until.Sub(now), ErrResponseTimeout
	}
	e := b.c.await(b.client, PhaseStream, now, timeout)
	if e != nil && e.Sign == SignTimeout {
		e.Err = cause
	}
	return e
}

// copyChunks copies into p[n:] the data of the chunks that are buffered
// whole or in part, reading their framing in place, and returns the new n.
// It stops at a line that is not buffered whole and at the last chunk's
// size line, which readLine reads (with a wait, and the trailers). A
// stream's events come a chunk each, and several are often buffered at
// once.
func (b *Body) copyChunks(p []byte, n int) (int, error) {
	r := b.c.br
	buf, _ := r.Peek(r.Buffered())
	pos := 0
	for n < len(p) {
		if b.left > 0 {
			m := int(min(int64(len(buf)-pos), int64(len(p)-n), b.left))
			if m == 0 {
				break
			}
			copy(p[n:], buf[pos:pos+m])
			n, pos, b.left = n+m, pos+m, b.left-int64(m)
			continue
		}
		i := bytes.IndexByte(buf[pos:], '\n')
		if i < 0 {
			break
		}
		line := trimEOL(buf[pos : pos+i+1])
		if b.afterData {
			// The CRLF that ends a chunk's data.
			if len(line) != 0 {
				r.Discard(pos)
				return n, errBadChunk
			}
			pos += i + 1
			b.afterData = false
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
		b.left, b.afterData = size, true
	}
	r.Discard(pos)
	return n, nil
}

// readLine reads one framing line, waiting for it: the CRLF after a
// chunk's data, or a size line; a zero size ends the body, and the
// trailers that follow it go into b.trailers.
func (b *Body) readLine() error {
	line, err := b.line()
	if err != nil {
		return err
	}
	if b.afterData {
		if len(line) != 0 {
			return b.c.fail(PhaseStream, errBadChunk)
		}
		b.afterData = false
		return nil
	}
	size, err := chunkSize(line)
	if err != nil {
		return b.c.fail(PhaseStream, err)
	}
	if size > 0 {
		b.left, b.afterData = size, true
		return nil
	}
	if err := b.wait(); err != nil {
		return err
	}
	b.c.src.due = b.c.r.set.cfg.StreamIdleTimeout
	if err := b.trailers.ReadTrailer(b.c.br); err != nil {
		if isReadError(err) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return b.c.fail(PhaseStream, err)
		}
		// Malformed or forbidden trailers: the body is whole, so it
		// ends cleanly without them, and the connection, with their
		// bytes unread, is not reused.
		b.c.broken = true
	} else {
		dropBadTrailers(b.trailers)
	}
	b.done = true
	return nil
}

// dropBadTrailers drops every trailer field of hd when one has a name that
// is not a token, which fasthttp takes: a malformed trailer section goes
// whole, as one that fasthttp refuses does. It allocates only for an
// answer with trailers.
func dropBadTrailers(hd *fasthttp.ResponseHeader) {
	section := bytes.TrimRight(hd.TrailerHeader(), "\r\n")
	if len(section) == 0 {
		return
	}
	var names [][]byte
	bad := false
	for _, line := range bytes.Split(section, crlf) {
		name, _, _ := bytes.Cut(line, []byte(":"))
		bad = bad || !IsToken(name)
		names = append(names, bytes.Clone(name))
	}
	for i := 0; bad && i < len(names); i++ {
		hd.DelBytes(names[i])
	}
}

var crlf = []byte("\r\n")

// IsToken reports whether b is an RFC 9110 token, the syntax of a field
// name.
func IsToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

// tokenChars are the bytes of a token.
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// line reads one line of the body's framing, waiting for it.
func (b *Body) line() ([]byte, error) {
	if err := b.wait(); err != nil {
		return nil, err
	}
	b.c.src.due = b.c.r.set.cfg.StreamIdleTimeout
	line, err := b.c.br.ReadSlice('\n')
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, b.c.fail(PhaseStream, err)
	}
	return trimEOL(line), nil
}

// isReadError reports whether err is a failure to read (end of stream, a
// timeout, a socket error) rather than bytes that could not be parsed.
func isReadError(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) || isTimeout(err)
}

// trimEOL drops a line's CR and LF.
func trimEOL(line []byte) []byte {
	n := len(line)
	for n > 0 && (line[n-1] == '\n' || line[n-1] == '\r') {
		n--
	}
	return line[:n]
}

// chunkSize reads a chunk's size line (its extensions and line end too).
func chunkSize(line []byte) (int64, error) {
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
