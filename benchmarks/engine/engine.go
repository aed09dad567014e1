// Package engine runs real llama.cpp servers (llama-server) on loopback
// with a tiny model, for the tests that hold warmroute and the simulator
// to a real inference engine: a real tokenizer, real prefill and decode
// kernels, and a real prompt cache that the engine itself reports.
//
// scripts/llama-engine.sh builds llama-server and the model once into a
// directory keyed by the llama.cpp source version; WARMROUTE_ENGINE names
// that directory, and without it the default cache's "current" link is
// used. The tests skip when neither holds an engine, unless CI is set:
// then a missing engine fails them.
package engine

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Model is the name the replicas serve the tiny model under.
const Model = "warmroute-tiny"

// Dir returns the directory expected to hold llama-server and tiny.gguf.
func Dir() string {
	if d := os.Getenv("WARMROUTE_ENGINE"); d != "" {
		return d
	}
	base := os.Getenv("WARMROUTE_ENGINE_DIR")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		base = filepath.Join(home, ".cache", "warmroute-engine")
	}
	return filepath.Join(base, "current")
}

// Require returns the engine's directory. It skips tb when no engine is
// built there, or fails it when CI is set, since CI builds one first.
func Require(tb testing.TB) string {
	tb.Helper()
	dir := Dir()
	for _, f := range []string{"llama-server", "tiny.gguf"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			msg := fmt.Sprintf("no real engine at %q (%v): scripts/llama-engine.sh builds one", dir, err)
			if os.Getenv("CI") != "" {
				tb.Fatal(msg)
			}
			tb.Skip(msg)
		}
	}
	return dir
}

// Options shape one llama-server.
type Options struct {
	// Slots is how many requests it runs at once (--parallel), each in a
	// slot of Context/Slots tokens that keeps its last prompt cached.
	Slots, Context int
	// Threads is its CPU threads; 1 keeps two replicas to two cores.
	Threads int
}

// Server is one llama-server process.
type Server struct {
	URL  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	mu   sync.Mutex
	log  []string // its last lines of output, for failures
}

// Start runs a llama-server from dir on a free loopback port and returns
// once its model is loaded; tb's cleanup kills it.
func Start(tb testing.TB, dir string, o Options) *Server {
	tb.Helper()
	if o.Slots == 0 {
		o.Slots = 2
	}
	if o.Context == 0 {
		o.Context = 16384 * o.Slots
	}
	if o.Threads == 0 {
		o.Threads = 1
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{URL: "http://127.0.0.1:" + strconv.Itoa(port), done: make(chan struct{})}
	s.cmd = exec.Command(filepath.Join(dir, "llama-server"),
		"-m", filepath.Join(dir, "tiny.gguf"), "--alias", Model,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-c", strconv.Itoa(o.Context), "--parallel", strconv.Itoa(o.Slots),
		"--threads", strconv.Itoa(o.Threads), "--threads-http", "2",
		"--no-webui", "--metrics", "--seed", "1")
	out, err := s.cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	s.cmd.Stdout = s.cmd.Stderr
	if err := s.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	loaded := make(chan struct{})
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.log = append(s.log, line)
			if len(s.log) > 40 {
				s.log = s.log[1:]
			}
			s.mu.Unlock()
			if strings.Contains(line, "model loaded") {
				once.Do(func() { close(loaded) })
			}
		}
		s.cmd.Wait()
	}()
	tb.Cleanup(s.Kill)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	select {
	case <-loaded:
	case <-s.done:
		tb.Fatalf("llama-server exited before its model loaded:\n%s", s.Log())
	case <-ctx.Done():
		tb.Fatalf("llama-server loaded no model in a minute:\n%s", s.Log())
	}
	return s
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (s *Server) Kill() {
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// Log returns the process's last lines of output.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.log, "\n")
}

// freePort returns a loopback port that nothing listened on a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
