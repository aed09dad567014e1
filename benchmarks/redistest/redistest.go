// Package redistest runs a real redis-server for tests: one per test, on a
// free loopback port, without persistence, that a test can stop, freeze and
// start again on the same port. No mock: what the pin store's tests and the
// fleet tests exercise is what rueidis and Redis do.
package redistest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The binary is Debian's package (`apt-get install -y redis-server`, which
// .ci/run does). Without the binary a test fails when CI is set (.ci/run sets it, and so
// does the CI runner), so CI can never pass by skipping them; elsewhere it is
// skipped with a line that says how to install it, so that `go test ./...`
// still needs only Go.

// Server is a redis-server process that a test can stop and start again
// on the same port.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	Addr string // host:port
	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{}
}

func Binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err == nil {
		return bin
	}
	const how = "redis-server not found in PATH: install it with `apt-get install -y redis-server` (Debian's package; .ci/run does)"
	if os.Getenv("CI") != "" {
		t.Fatal(how + " — CI is set, so the pin store tests must run")
	}
	t.Skip(how + " — skipped because CI is not set")
	return ""
}

// Start starts a redis-server on a free loopback port and stops it when
// the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	r := New(t)
	r.Start()
	return r
}

// New prepares a server on a free loopback port without starting it (a
// test of what runs before Redis does); Start starts it, and it is stopped
// when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	r := &Server{t: t, bin: Binary(t), dir: t.TempDir(), port: FreePort(t)}
	r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
	t.Cleanup(r.Stop)
	return r
}

// Eventually polls cond until it holds, failing the test after 10 s.
func Eventually(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(2 * time.Millisecond) // poll interval, not a synchronisation
	}
}

// URL is the server's redis:// URL, database 0.
func (r *Server) URL() string { return "redis://" + r.Addr + "/0" }

// FreePort returns a loopback port that nothing listened on a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// Start runs redis-server and waits until it answers PING.
func (r *Server) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out bytes.Buffer
	cmd := exec.Command(r.bin,
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--daemonize", "no", "--loglevel", "warning",
		"--logfile", filepath.Join(r.dir, "redis.log"))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	exit := make(chan struct{})
	go func() { cmd.Wait(); close(exit) }()
	r.cmd, r.exit = cmd, exit
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := Ping(r.Addr); err == nil {
			return
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.t.Fatalf("redis-server on %s did not answer PING in 15s: %v\n%s%s", r.Addr, err, out.String(), log)
		}
		select {
		case <-exit:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.t.Fatalf("redis-server on %s exited at start: %v\n%s%s", r.Addr, cmd.ProcessState, out.String(), log)
		case <-time.After(10 * time.Millisecond): // poll interval, not a synchronisation
		}
	}
}

// Stop kills redis-server (SIGKILL, as a crash would) and waits for its exit.
func (r *Server) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	<-r.exit
	r.cmd = nil
}

// Signal sends sig (SIGSTOP, SIGCONT) to the running redis-server.
func (r *Server) Signal(sig os.Signal) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatal(err)
	}
}

// Ping sends PING and reads +PONG, with a deadline.
func Ping(addr string) error {
	_, err := Do(addr, "PING")
	return err
}

// Do sends one command in RESP and returns the reply's first line (and the
// bulk string that follows a $ line), with a deadline: a tiny client for the
// tests to look at Redis behind the store's back.
func Do(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("empty reply")
	case line[0] == '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case line[0] == '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err // nil bulk: "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line[1:], nil
}

// DoInt is Do for an integer reply.
func DoInt(t testing.TB, addr string, args ...string) int64 {
	t.Helper()
	v, err := Do(addr, args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%v: not an integer: %q", args, v)
	}
	return n
}

// UsedMemory returns INFO memory's used_memory.
func UsedMemory(t testing.TB, addr string) int64 {
	t.Helper()
	v, err := Do(addr, "INFO", "memory")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(v, "\r\n") {
		if s, ok := strings.CutPrefix(l, "used_memory:"); ok {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no used_memory in INFO memory:\n%s", v)
	return 0
}
