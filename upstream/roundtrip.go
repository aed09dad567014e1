package upstream

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Interim receives a 103 Early Hints answer, its headers in the head that
// RoundTrip reads into. A *fasthttp.RequestCtx is one.
type Interim interface{ EarlyHints() error }

// maxInterim bounds the 1xx answers read before the final one.
const maxInterim = 8

var errBadFieldName = errors.New("replica sent a header field whose name is not a token")

var errBadInterim = fmt.Errorf("replica sent 101 Switching Protocols or more than %d interim answers", maxInterim)

// RoundTrip writes the request (head and body) and reads the head of the
// replica's final answer into hd; sent is the caller's clock reading as
// it sends. Interim answers are consumed (100, 102) or passed to early
// (103) until the final one; client, if not nil, is polled while the
// replica works, and its leaving ends the wait (SignClientGone). The body
// is read next, with ReadWhole or Body. Every failure is an *Error with the
// evidence that Judge needs, and keeps c out of the pool.
func (c *Conn) RoundTrip(head, body []byte, hd *fasthttp.ResponseHeader, client net.Conn, early Interim, sent time.Time) *Error {
	if !c.writeInWait(head, body) {
		if err := c.sent(c.write(head, body)); err != nil {
			return err
		}
	}
	cfg := &c.r.set.cfg
	phase := PhaseAwait
	c.until = time.Time{}
	wait := cfg.FirstByteTimeout
	if cfg.ResponseTimeout > 0 {
		c.until = sent.Add(cfg.ResponseTimeout)
		wait = min(wait, cfg.ResponseTimeout)
	}
	for interim := 0; ; interim++ {
		if err := c.await(client, phase, sent, wait); err != nil {
			if err.Sign == SignTimeout && wait < cfg.FirstByteTimeout {
				err.Err = ErrResponseTimeout
			}
			return err
		}
		phase = PhaseHead // the replica has the request
		// A head not buffered whole gets StreamIdleTimeout for its rest.
		c.src.due = cfg.StreamIdleTimeout
		if err := hd.Read(c.br); err != nil {
			return c.fail(PhaseHead, err)
		}
		for k := range hd.All() {
			if !IsToken(k) {
				// fasthttp takes a name with a space; a client could
				// misread it, so the answer is not relayed.
				return c.fail(PhaseHead, errBadFieldName)
			}
		}
		status := hd.StatusCode()
		if status >= 200 {
			if hd.ConnectionClose() {
				// The replica closes its connection after this answer.
				c.broken = true
			}
			return nil
		}
		if status == fasthttp.StatusSwitchingProtocols || interim == maxInterim {
			return c.fail(PhaseHead, errBadInterim)
		}
		if status == fasthttp.StatusEarlyHints && early != nil {
			early.EarlyHints() // a client that left is found by the next wait
		}
	}
}

// ReadWhole reads the body of the answer whose head is resp's into resp,
// up to limit bytes (0: no limit): an answer with a length, or, for a
// client that cannot take a stream, one of unknown length. Its trailers are
// dropped.
func (c *Conn) ReadWhole(resp *fasthttp.Response, limit int) *Error {
	if resp.Header.ContentLength() < 0 {
		// Read until the end, however long the replica takes: bounded as
		// the wait for an answer is.
		c.src.due = c.r.set.cfg.FirstByteTimeout
		if resp.Header.ContentLength() == -1 {
			c.broken = true // its trailers are not read
		}
	} else {
		c.src.due = c.r.set.cfg.StreamIdleTimeout
	}
	if !c.until.IsZero() {
		c.src.due = max(min(c.src.due, time.Until(c.until)), 1)
	}
	if err := resp.ReadBody(c.br, limit); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return c.fail(PhaseBody, err)
	}
	resp.Header.DelBytes(strTrailer)
	return nil
}

var strTrailer = []byte("Trailer")

// Discard leaves the answer's body unread: c is not reused.
func (c *Conn) Discard() { c.broken = true }
