// Command gorelay is an HTTP/1.1 keep-alive relay in plain Go, as small as
// a Go proxy can be: a goroutine per client connection, a pool of
// keep-alive connections per upstream, round-robin, and of HTTP only what
// framing needs (Content-Length, chunked). It copies the request head as it
// came and the answer as it comes, with no header rules, no routing, no
// timeouts and no metrics. scripts/peers.sh measures it as "relay": the
// floor that the Go runtime's network I/O puts under any Go proxy (each
// wait for a socket is a read that returns EAGAIN, a park in the
// netpoller and a wake), beside nginx, which waits in epoll itself.
//
// It is a measuring tool, not a proxy: it trusts its upstreams and clients.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

var (
	listen    = flag.String("listen", "127.0.0.1:9080", "Address to serve on.")
	upstreams = flag.String("upstream", "127.0.0.1:9001,127.0.0.1:9002", "Comma-separated host:port of the upstreams.")
)

type upConn struct {
	nc net.Conn
	br *bufio.Reader
}

type pool struct {
	addr string
	mu   sync.Mutex
	idle []*upConn
}

func (p *pool) get() (*upConn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	nc, err := net.Dial("tcp", p.addr)
	if err != nil {
		return nil, err
	}
	return &upConn{nc: nc, br: bufio.NewReaderSize(nc, 8<<10)}, nil
}

func (p *pool) put(c *upConn) {
	p.mu.Lock()
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

var (
	pools []*pool
	next  atomic.Uint64
)

func main() {
	flag.Parse()
	for _, a := range strings.Split(*upstreams, ",") {
		pools = append(pools, &pool{addr: a})
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gorelay:", err)
		os.Exit(2)
	}
	for {
		nc, err := ln.Accept()
		if err != nil {
			continue
		}
		go serve(nc)
	}
}

var errFraming = errors.New("framing")

// readHead appends the head at br (through its empty line) to dst and
// returns it with the value of its Content-Length (-1: none), whether it
// is chunked and whether it says Connection: close.
func readHead(dst []byte, br *bufio.Reader) ([]byte, int, bool, bool, error) {
	cl, chunked, closing := -1, false, false
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return dst, 0, false, false, err
		}
		dst = append(dst, line...)
		if len(line) <= 2 {
			return dst, cl, chunked, closing, nil
		}
		if i := bytes.IndexByte(line, ':'); i > 0 {
			k, v := line[:i], bytes.TrimSpace(line[i+1:])
			switch {
			case bytes.EqualFold(k, []byte("Content-Length")):
				cl = 0
				for _, c := range v {
					cl = cl*10 + int(c-'0')
				}
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				chunked = true
			case bytes.EqualFold(k, []byte("Connection")):
				closing = bytes.EqualFold(v, []byte("close"))
			}
		}
	}
}

func serve(client net.Conn) {
	defer client.Close()
	br := bufio.NewReaderSize(client, 8<<10)
	buf := make([]byte, 0, 16<<10)
	for {
		req, cl, _, closing, err := readHead(buf[:0], br)
		if err != nil {
			return
		}
		if cl > 0 {
			start := len(req)
			req = append(req, make([]byte, cl)...)
			if _, err := io.ReadFull(br, req[start:]); err != nil {
				return
			}
		}
		p := pools[next.Add(1)%uint64(len(pools))]
		u, err := p.get()
		if err != nil {
			return
		}
		if _, err := u.nc.Write(req); err != nil {
			u.nc.Close()
			return
		}
		buf = req
		if buf, err = relay(client, u.br, buf[:0]); err != nil {
			u.nc.Close()
			return
		}
		p.put(u)
		if closing {
			// The client reads the answer to its end (scripts/streams.sh).
			return
		}
	}
}

// relay copies one answer from up to client: a Content-Length body in one
// write with its head, a chunked one as it arrives, with every write
// holding all that was read before the relay would wait.
func relay(client net.Conn, up *bufio.Reader, out []byte) ([]byte, error) {
	out, cl, chunked, _, err := readHead(out, up)
	if err != nil {
		return out, err
	}
	if !chunked {
		if cl > 0 {
			start := len(out)
			out = append(out, make([]byte, cl)...)
			if _, err := io.ReadFull(up, out[start:]); err != nil {
				return out, err
			}
		}
		_, err := client.Write(out)
		return out, err
	}
	flush := func() error {
		if up.Buffered() == 0 && len(out) > 0 {
			_, err := client.Write(out)
			out = out[:0]
			return err
		}
		return nil
	}
	for {
		if err := flush(); err != nil {
			return out, err
		}
		line, err := up.ReadSlice('\n')
		if err != nil {
			return out, err
		}
		out = append(out, line...)
		size := 0
		for _, c := range bytes.TrimSpace(line) {
			switch {
			case c >= '0' && c <= '9':
				size = size<<4 | int(c-'0')
			case c >= 'a' && c <= 'f':
				size = size<<4 | int(c-'a'+10)
			case c >= 'A' && c <= 'F':
				size = size<<4 | int(c-'A'+10)
			default:
				return out, errFraming
			}
		}
		if size == 0 {
			for { // trailers, then the empty line
				if err := flush(); err != nil {
					return out, err
				}
				line, err := up.ReadSlice('\n')
				if err != nil {
					return out, err
				}
				out = append(out, line...)
				if len(line) <= 2 {
					_, err := client.Write(out)
					return out, err
				}
			}
		}
		for left := size + 2; left > 0; {
			if err := flush(); err != nil {
				return out, err
			}
			b, _ := up.Peek(min(max(up.Buffered(), 1), left))
			if len(b) == 0 {
				return out, io.ErrUnexpectedEOF
			}
			out = append(out, b...)
			up.Discard(len(b))
			left -= len(b)
		}
	}
}
