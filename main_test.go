package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// build compiles warmroute once per test binary.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "warmroute")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestBadFlagsFailAtStartup(t *testing.T) {
	bin := build(t)
	tests := []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"-routing", "random", "-simulate", "1"}, "", `unknown routing policy "random"; valid: cost, adaptive, affinity, roundrobin`},
		{[]string{"-simulate", "1"}, "ROUTING=fastest", `unknown routing policy "fastest"`},
		{[]string{"-simulate", "1", "-max-body-size", "12parsecs"}, "", `invalid size "12parsecs"`},
		{[]string{"-simulate", "1"}, "WARMROUTE_CONNECT_TIMEOUT=soon", `invalid WARMROUTE_CONNECT_TIMEOUT="soon"`},
		{nil, "", "no replicas: set -upstream"},
		{[]string{"-upstream", "ftp://a:1"}, "", `scheme "ftp" is not supported; use http:// or https://`},
		{[]string{"-upstream", "http://a:1,http://a:1"}, "", `upstream "http://a:1" is the same replica as "http://a:1"`},
		{[]string{"-upstream", "http://127.0.0.1:8001/v1"}, "", `has a path (/v1)`},
		{[]string{"-upstream", "http://a:8001 http://a:8002"}, "", "contains a space"},
		{[]string{"-upstream", "127.0.0.1:99999"}, "", `port "99999" is not a number from 1 to 65535`},
		{[]string{"-upstream", "127.0.0.1"}, "", `upstream "127.0.0.1" has no port`},
		{[]string{"-simulate", "1", "stray", "-listen", ":0"}, "", `unexpected argument "stray"`},
		{[]string{"-simulate", "1", "-cooldown", "5"}, "", `invalid value "5" for flag -cooldown: want a positive duration with a unit, like 5s`},
		{[]string{"-simulate", "1", "-stall-timeout", "-1s"}, "", `invalid value "-1s" for flag -stall-timeout`},
		{[]string{"-simulate", "1", "-api-key-file", "/dev/null"}, "", `-api-key-file /dev/null holds no key`},
		{[]string{"-upstream", "127.0.0.1:8001", "-upstream-dns", "vllm:8000"}, "", `-upstream and -upstream-dns/-srv/-file are exclusive`},
		{[]string{"-upstream-dns", "vllm"}, "", `-upstream-dns "vllm": want name:port`},
		{[]string{"-upstream-file", "/nonexistent/replicas"}, "", `-upstream-file: open /nonexistent/replicas`},
		{[]string{"-simulate", "1", "-api-key-file", "/nonexistent/keys"}, "", `-api-key-file: open /nonexistent/keys`},
		{[]string{"-simulate", "1", "-log-format", "xml"}, "", `invalid -log-format "xml"`},
		{[]string{"-simulate", "1", "-prompt-chunk", "16"}, "", `-prompt-chunk must be from 64 bytes to under 64KiB`},
		{[]string{"-simulate", "1", "-prompt-chunk", "1MiB"}, "", `-prompt-chunk must be from 64 bytes to under 64KiB`},
		{[]string{"-simulate", "1", "-kv-capacity", "-5"}, "", `-kv-capacity 0 or more`},
		{[]string{"-simulate", "1", "-held-memory", "1KiB"}, "", `-held-memory at least 64KiB`},
		{[]string{"-simulate", "1", "-otlp-endpoint", "grpc://collector:4317"}, "", `-otlp-endpoint: OTLP endpoint "grpc://collector:4317": the scheme "grpc" is neither http nor https`},
		{[]string{"-simulate", "1", "-otlp-endpoint", "collector:4318"}, "", `-otlp-endpoint: OTLP endpoint "collector:4318"`},
		{[]string{"-simulate", "1", "-relay-above", "64"}, "", `invalid value "64" for flag -relay-above: this flag was removed: streams are served by the HTTP server's own connection goroutines`},
		{[]string{"-simulate", "1", "--relay-waiting-above=0"}, "", `flag -relay-waiting-above: this flag was removed`},
		{[]string{"-simulate", "1"}, "WARMROUTE_RELAY_ABOVE=64", `invalid WARMROUTE_RELAY_ABOVE="64": this flag was removed`},
	}
	for _, tt := range tests {
		cmd := exec.Command(bin, tt.args...)
		cmd.Env = os.Environ()
		if tt.env != "" {
			cmd.Env = append(cmd.Env, tt.env)
		}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tt.want) {
			t.Errorf("%v %s: exit %v, output %q; want exit 2 with %q", tt.args, tt.env, err, out, tt.want)
		}
	}
}

// TestSIGTERMDrainsStreams starts warmroute on simulated replicas, sends
// SIGTERM while a stream is running, and checks that the stream completes
// and the process exits 0.
func TestSIGTERMDrainsStreams(t *testing.T) {
	bin := build(t)
	cmd, addr, _, logs := startWarmroute(t, bin, "-simulate", "1", "-listen", "127.0.0.1:0", "-admin-listen", "", "-drain-delay", "100ms", "-drain-timeout", "10s")
	br := openStream(t, addr, 40) // 40 tokens at the simulated engine's 20 ms a step: about 0.8 s
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream did not complete after SIGTERM: %v, ends %q", err, rest[max(0, len(rest)-80):])
	}
	if n := strings.Count(string(rest), `"content":"tok "`); n != 39 && n != 40 {
		t.Fatalf("the stream carried %d tokens, want 40", n)
	}
	waitExit(t, cmd, logs)
	t.Logf("stream finished and process exited %v after SIGTERM", time.Since(start))
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		t.Fatal("still accepting after exit")
	}
}

// openStream starts a streamed chat completion of n tokens and returns its
// body once the first event has come.
func openStream(t *testing.T, addr string, n int) *bufio.Reader {
	t.Helper()
	body := fmt.Sprintf(`{"model":"sim-30b","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"count"}]}`, n)
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q %v", line, err)
	}
	return br
}

// waitExit waits for cmd to exit 0; 10 s without it fails the test.
func waitExit(t *testing.T, cmd *exec.Cmd, logs *syncLog) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("warmroute did not exit")
	}
}

func TestVersion(t *testing.T) {
	out, err := exec.Command(build(t), "-version").CombinedOutput()
	if err != nil || !regexp.MustCompile(`^warmroute \S+ .*go1\.\d+`).Match(out) {
		t.Fatalf("-version: %v %q", err, out)
	}
}

// TestFlagGroups checks that -help lists every flag once, under its
// group, and neither a renamed flag's old name nor a removed flag.
func TestFlagGroups(t *testing.T) {
	seen := map[string]string{}
	for _, g := range flagGroups {
		for _, name := range strings.Fields(g.names) {
			if flag.Lookup(name) == nil {
				t.Errorf("group %q lists -%s, which is no flag", g.title, name)
			}
			if other, ok := seen[name]; ok {
				t.Errorf("-%s is in %q and %q", name, other, g.title)
			}
			seen[name] = g.title
		}
	}
	flag.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "test.") {
			return // the test binary's own
		}
		_, gone := removedFlags[f.Name]
		old := renamedFlags[f.Name] != ""
		if _, listed := seen[f.Name]; listed == (gone || old) {
			t.Errorf("-%s: listed %v, removed %v, renamed %v; want every current flag in one group, no other", f.Name, listed, gone, old)
		}
	})
	out, _ := exec.Command(build(t), "-help").CombinedOutput()
	help := string(out)
	for _, want := range []string{"Front door:\n", "Routing:\n", "-client-idle-timeout", "Formerly -idle-timeout"} {
		if !strings.Contains(help, want) {
			t.Errorf("-help lacks %q", want)
		}
	}
	for _, gone := range []string{"-relay-above", "-max-body-bytes ", "  -idle-timeout"} {
		if strings.Contains(help, gone) {
			t.Errorf("-help lists %q", gone)
		}
	}
}

// TestRenamedFlagStillWorks sets a flag by its old name, from the command
// line and from the environment: it takes effect, and is logged once.
func TestRenamedFlagStillWorks(t *testing.T) {
	bin := build(t)
	t.Setenv("WARMROUTE_MAX_BODY_BYTES", "96MiB")
	cmd, _, _, logs := startWarmroute(t, bin, "-simulate", "1", "-listen", "127.0.0.1:0", "-admin-listen", "", "-idle-timeout", "7s", "-idle-timeout", "8s")
	defer cmd.Process.Kill()
	log := logs.String()
	for _, want := range []string{"client_idle_timeout=8s", "max_body_memory=96MiB",
		`msg="flag renamed; the old name still works" flag=-idle-timeout now=-client-idle-timeout`,
		`msg="flag renamed; the old name still works" flag=-max-body-bytes now=-max-body-memory`} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if n := strings.Count(log, "flag=-idle-timeout"); n != 1 {
		t.Errorf("the rename of -idle-timeout logged %d times; want once", n)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"64MiB": 64 << 20, "512kib": 512 << 10, "1GB": 1e9, "1024": 1024, "2 MB": 2e6, "10k": 10 << 10} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "0", "1.5MiB", "MiB", "9999999GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) did not fail", in)
		}
	}
	if formatSize(64<<20) != "64MiB" || formatSize(1000) != "1000B" {
		t.Error("formatSize")
	}
}

// startWarmroute runs the binary with args and returns its front and admin
// addresses, read from its start line, and its log so far and to come.
func startWarmroute(t *testing.T, bin string, args ...string) (cmd *exec.Cmd, front, admin string, logs *syncLog) {
	t.Helper()
	cmd = exec.Command(bin, args...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	logs = &syncLog{}
	sc := bufio.NewScanner(stderr)
	started := regexp.MustCompile(`msg="warmroute started" listen=(\S+) admin_listen=(\S*)`)
	for sc.Scan() {
		logs.add(sc.Text())
		if m := started.FindStringSubmatch(sc.Text()); m != nil {
			front, admin = m[1], m[2]
			break
		}
	}
	if front == "" {
		t.Fatalf("no start line:\n%s", logs)
	}
	go func() {
		for sc.Scan() {
			logs.add(sc.Text())
		}
	}()
	return cmd, front, admin, logs
}

type syncLog struct {
	mu    sync.Mutex
	b     strings.Builder
	added chan struct{} // a line came
}

func (l *syncLog) add(line string) {
	l.mu.Lock()
	l.b.WriteString(line + "\n")
	if l.added == nil {
		l.added = make(chan struct{}, 1)
	}
	added := l.added
	l.mu.Unlock()
	select {
	case added <- struct{}{}:
	default:
	}
}

// waitFor blocks until the log holds s; 10 s without it fails the test.
func (l *syncLog) waitFor(t *testing.T, s string) {
	t.Helper()
	l.mu.Lock()
	if l.added == nil {
		l.added = make(chan struct{}, 1)
	}
	added := l.added
	l.mu.Unlock()
	timeout := time.After(10 * time.Second)
	for !strings.Contains(l.String(), s) {
		select {
		case <-added:
		case <-timeout:
			t.Fatalf("no %q in the log within 10 s:\n%s", s, l)
		}
	}
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A rolling deploy: on SIGTERM both /health endpoints answer 503 at once,
// new connections are still accepted and served during -drain-delay, then
// in-flight work gets -drain-timeout, and a stream that outlives it is cut,
// logged as cut by the drain and not as a replica fault; the exit is 0.
func TestRollingDeploy(t *testing.T) {
	bin := build(t)
	const delay, timeout = time.Second, time.Second
	cmd, front, admin, logs := startWarmroute(t, bin, "-simulate", "1", "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
		"-drain-delay", delay.String(), "-drain-timeout", timeout.String())
	br := openStream(t, front, 400) // 8 s at the simulated engine's 20 ms a step: longer than the drain
	streamDone := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(br)
		streamDone <- err
	}()
	signalled := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	logs.waitFor(t, "draining: /health answers 503")
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	for _, addr := range []string{front, admin} {
		r, err := fresh.Get("http://" + addr + "/health")
		if err != nil || r.StatusCode != 503 {
			t.Fatalf("/health on %s right after SIGTERM: %v %v, want 503", addr, r, err)
		}
		r.Body.Close()
	}
	short := `{"model":"sim-30b","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	served := 0
	for time.Since(signalled) < delay*7/10 { // new connections, each served
		r, err := fresh.Post("http://"+front+"/v1/chat/completions", "application/json", strings.NewReader(short))
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("a new connection %v into the drain delay: %v %v", time.Since(signalled), r, err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		served++
	}
	select {
	case err := <-streamDone:
		if err == nil {
			t.Fatal("a stream that outlived the drain ended cleanly")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream was never cut")
	}
	waitExit(t, cmd, logs)
	took := time.Since(signalled)
	t.Logf("%d requests on new connections served during the delay; exit %v after SIGTERM", served, took)
	if took < delay+timeout {
		t.Fatalf("exited %v after SIGTERM, before the delay and the timeout (%v)", took, delay+timeout)
	}
	out := logs.String()
	if !strings.Contains(out, "drain timed out; cutting the requests still in flight") || strings.Contains(out, "replica stream cut") {
		t.Fatalf("the cut stream was not logged as the drain's:\n%s", out)
	}
}

// API keys are read from -api-key-file at start and again on SIGHUP.
func TestAPIKeysReloadOnSIGHUP(t *testing.T) {
	bin := build(t)
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("# the team's key\nsk-old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, front, _, logs := startWarmroute(t, bin, "-simulate", "1", "-listen", "127.0.0.1:0", "-admin-listen", "", "-api-key-file", file)
	status := func(key string) int {
		req, _ := http.NewRequest("POST", "http://"+front+"/v1/chat/completions", strings.NewReader(`{"model":"sim-30b","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if a, b := status("sk-old"), status("sk-new"); a != 200 || b != 401 {
		t.Fatalf("before SIGHUP: old key %d, new key %d", a, b)
	}
	if err := os.WriteFile(file, []byte("sk-new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	logs.waitFor(t, "API keys reloaded")
	if a, b := status("sk-old"), status("sk-new"); a != 401 || b != 200 {
		t.Fatalf("after SIGHUP: old key %d, new key %d", a, b)
	}
}

// Replicas listed in -upstream-file follow the file on SIGHUP: the one added
// joins after its first good probe, the one dropped leaves.
func TestUpstreamFileOnSIGHUP(t *testing.T) {
	bin := build(t)
	replica := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"replica":%q}`, name)
		}))
		t.Cleanup(s.Close)
		return s
	}
	a, b := replica("a"), replica("b")
	file := filepath.Join(t.TempDir(), "replicas")
	if err := os.WriteFile(file, []byte(a.URL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, front, _, logs := startWarmroute(t, bin, "-upstream-file", file, "-listen", "127.0.0.1:0", "-admin-listen", "", "-health-interval", "100ms")
	ask := func() string {
		resp, err := http.Post("http://"+front+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(body)
	}
	if got := ask(); got != `{"replica":"a"}` {
		t.Fatalf("before the edit: %s", got)
	}
	// The same size and second as the first write would hide the change
	// from the file watcher; SIGHUP reads it anyway.
	if err := os.WriteFile(file, []byte(b.URL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	logs.waitFor(t, `msg="replica joined"`)
	logs.waitFor(t, `msg="replica removed from the set"`)
	for i := 0; i < 4; i++ {
		if got := ask(); got != `{"replica":"b"}` {
			t.Fatalf("after the edit and SIGHUP: %s", got)
		}
	}
}
