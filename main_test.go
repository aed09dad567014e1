package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
		{[]string{"-routing", "random", "-simulate", "1"}, "", `unknown routing policy "random"; valid: adaptive, affinity, roundrobin`},
		{[]string{"-simulate", "1"}, "ROUTING=fastest", `unknown routing policy "fastest"`},
		{[]string{"-simulate", "1", "-max-body-size", "12parsecs"}, "", `invalid size "12parsecs"`},
		{[]string{"-simulate", "1"}, "WARMROUTE_CONNECT_TIMEOUT=soon", `invalid WARMROUTE_CONNECT_TIMEOUT="soon"`},
		{nil, "", "no replicas: set -upstream"},
		{[]string{"-upstream", "https://a:1"}, "", `scheme "https" is not supported`},
		{[]string{"-upstream", "http://a:1,http://a:1"}, "", `upstream "http://a:1" is the same replica as "http://a:1"`},
		{[]string{"-upstream", "http://127.0.0.1:8001/v1"}, "", `has a path (/v1)`},
		{[]string{"-upstream", "http://a:8001 http://a:8002"}, "", "contains a space"},
		{[]string{"-upstream", "127.0.0.1:99999"}, "", `port "99999" is not a number from 1 to 65535`},
		{[]string{"-upstream", "127.0.0.1"}, "", `upstream "127.0.0.1" has no port`},
		{[]string{"-simulate", "1", "stray", "-listen", ":0"}, "", `unexpected argument "stray"`},
		{[]string{"-simulate", "1", "-cooldown", "5"}, "", `invalid value "5" for flag -cooldown: want a positive duration with a unit, like 5s`},
		{[]string{"-simulate", "1", "-stall-timeout", "-1s"}, "", `invalid value "-1s" for flag -stall-timeout`},
		{[]string{"-simulate", "1", "-log-format", "xml"}, "", `invalid -log-format "xml"`},
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
	cmd := exec.Command(bin, "-simulate", "1", "-listen", "127.0.0.1:0", "-admin-listen", "", "-drain-timeout", "10s")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	logs := bufio.NewScanner(stderr)
	listen := regexp.MustCompile(`msg="warmroute started" listen=(\S+)`)
	var addr string
	var logged strings.Builder
	for logs.Scan() {
		logged.WriteString(logs.Text() + "\n")
		if m := listen.FindStringSubmatch(logs.Text()); m != nil {
			addr = m[1]
			break
		}
	}
	if addr == "" {
		t.Fatalf("no start line:\n%s", logged.String())
	}
	go io.Copy(&logged, stderr)
	// 40 tokens at the simulated engine's 20 ms a step: about 0.8 s.
	body := `{"model":"m","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"count"}]}`
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q %v", line, err)
	}
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
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logged.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("warmroute did not exit after the stream ended")
	}
	t.Logf("stream finished and process exited %v after SIGTERM", time.Since(start))
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		t.Fatal("still accepting after exit")
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
