package router

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// splitMatch returns data for a last chunk that fasthttp's writer splits
// when prefix (what the writer holds, the chunk's size line included) goes
// before it, and whose first write, a full buffer, ends as the whole chunk
// would: with data and CRLF. The data repeats the bytes before it. nil
// when no length fits.
func splitMatch(prefix func(size int) []byte) []byte {
	for size := 1; size <= writeBuffer-2; size++ {
		pre := prefix(size)
		if size <= writeBuffer-len(pre) {
			continue // not split
		}
		m := len(pre) - (writeBuffer - size - 2)
		s := make([]byte, size+2)
		for j := range s {
			if j < m {
				s[j] = pre[len(pre)-m+j]
			} else {
				s[j] = s[j-m]
			}
		}
		if s[size] == '\r' && s[size+1] == '\n' {
			return s[:size]
		}
	}
	return nil
}

// writeBuffer is the size of fasthttp's writer of an answer (its
// default): a last chunk larger than what is left of it is split.
const writeBuffer = 4 << 10

// endChunk ends a chunked body that has no trailers.
var endChunk = []byte("0\r\n\r\n")

// An answer that declares a trailer ends, through fasthttp, with the
// trailer's value where the proxy has one (its own X-Warmroute-Replica
// header, say): its end does not go in the last data's write, which would
// end the body twice and break the next answer.
func TestStreamEndWithATrailerDeclared(t *testing.T) {
	for _, head := range []string{
		"Trailer: X-Warmroute-Replica\r\n",
		"Trailer: X-Foo\r\nX-Foo: bar\r\n",
	} {
		sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + head + "Transfer-Encoding: chunked\r\n\r\n" +
			"9\r\ndata: a\n\n\r\n0\r\n\r\n"
		replica := rawReplica(t, true, func() []byte { return []byte(sse) })
		streamTwice(t, startProxy(t, RoundRobin, []string{replica}), []byte("data: a\n\n"), head)
	}
}

// A last chunk that fasthttp's writer splits, its head written with it,
// whose data repeats the bytes before it so that the first write ends as
// the whole chunk would (data, CRLF): its end goes on its own, not inside
// the chunk.
func TestStreamEndNotInAPartOfItsChunk(t *testing.T) {
	var body atomic.Value
	body.Store([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n"))
	replica := rawReplica(t, true, func() []byte { return body.Load().([]byte) })
	p := startProxy(t, RoundRobin, []string{replica})
	// The head as the proxy writes it.
	c := dialProxy(t, p)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, streamRequest(""))
	var raw []byte
	buf := make([]byte, 8192)
	for !bytes.Contains(raw, []byte("\r\n0\r\n\r\n")) {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, buf[:n]...)
	}
	head := raw[:bytes.Index(raw, []byte("\r\n\r\n"))+4]
	data := splitMatch(func(size int) []byte { return append(append([]byte{}, head...), sizeLine(size)...) })
	if data == nil {
		t.Skipf("no data length for a head of %d bytes", len(head))
	}
	body.Store(oneChunk(data))
	streamTwice(t, p, data, "data of "+strconv.Itoa(len(data))+" bytes")
}

// A pipelined request whose replica sends 103 Early Hints, which fasthttp
// writes through a writer of its own before the first stream's end, held in
// the server's writer, goes out: the first stream's end, sent with its last
// data, is dropped from the server's writer all the same.
func TestStreamEndWithEarlyHintsPipelined(t *testing.T) {
	sse := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"9\r\ndata: a\n\n\r\n0\r\n\r\n"
	var calls atomic.Int32
	replica := rawReplica(t, true, func() []byte {
		if calls.Add(1) == 2 {
			return []byte("HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n" + sse)
		}
		return []byte(sse)
	})
	p := startProxy(t, RoundRobin, []string{replica})
	c := dialProxy(t, p)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, streamRequest("")+streamRequest(""))
	br := bufio.NewReader(c)
	for i := range 2 {
		resp, err := http.ReadResponse(br, nil)
		if err == nil && resp.StatusCode == http.StatusEarlyHints {
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if got, err := io.ReadAll(resp.Body); err != nil || string(got) != "data: a\n\n" {
			t.Fatalf("answer %d: %q, %v", i, got, err)
		}
	}
}

// A pipelined stream's last chunk that fasthttp's writer splits, written
// behind the previous stream's end (sent with its data, fasthttp's own
// still in the writer): the end dropped from the writer's first, full
// write leaves it shorter than the buffer, and data made to repeat the
// bytes before it matched there; the whole write's length decides.
func TestStreamEndNotInAPartOfAPipelinedChunk(t *testing.T) {
	small := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n")
	var second atomic.Value
	second.Store(small)
	var calls atomic.Int32
	replica := rawReplica(t, true, func() []byte {
		if calls.Add(1)%3 == 2 {
			return second.Load().([]byte)
		}
		return small
	})
	p := startProxy(t, RoundRobin, []string{replica})
	// The head as the proxy writes it, from three answers (the replica's
	// calls count in threes).
	c := dialProxy(t, p)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	var head []byte
	for range 3 {
		io.WriteString(c, streamRequest(""))
		var raw []byte
		buf := make([]byte, 8192)
		for !bytes.Contains(raw, []byte("\r\n0\r\n\r\n")) {
			n, err := br.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			raw = append(raw, buf[:n]...)
		}
		head = raw[:bytes.Index(raw, []byte("\r\n\r\n"))+4]
	}
	data := splitMatch(func(size int) []byte {
		return append(append(append([]byte{}, endChunk...), head...), sizeLine(size)...)
	})
	if data == nil {
		t.Skipf("no data length for a head of %d bytes", len(head))
	}
	second.Store(oneChunk(data))
	c = dialProxy(t, p)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, streamRequest("")+streamRequest("")+streamRequest(""))
	br = bufio.NewReader(c)
	for i, want := range [][]byte{[]byte("data: a\n\n"), data, []byte("data: a\n\n")} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("data of %d bytes, answer %d: %v", len(data), i, err)
		}
		if got, err := io.ReadAll(resp.Body); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("data of %d bytes, answer %d: %d bytes (want %d), %v", len(data), i, len(got), len(want), err)
		}
	}
}
