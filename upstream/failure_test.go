package upstream

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	reset := &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	refused := &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	tests := []struct {
		name   string
		phase  Phase
		reused bool
		err    error
		want   Fault
		demote bool
	}{
		{"dial refused", PhaseDial, false, refused, NotSent, true},
		{"dial timeout", PhaseDial, false, os.ErrDeadlineExceeded, NotSent, true},
		{"write broken pipe on reused conn", PhaseWrite, true, syscall.EPIPE, NotSent, false},
		{"write on fresh conn", PhaseWrite, false, syscall.ECONNRESET, NotSent, true},
		{"reset before response on reused conn", PhaseAwait, true, reset, NotSent, false},
		{"reset before response on fresh conn", PhaseAwait, false, reset, NotSent, true},
		{"pending EPIPE behind FIN", PhaseAwait, true, os.NewSyscallError("read", syscall.EPIPE), NotSent, false},
		{"FIN that did not acknowledge the request", PhaseAwait, true, ErrClosedBeforeRequest, NotSent, false},
		{"FIN that did not acknowledge the request, fresh conn", PhaseAwait, false, ErrClosedBeforeRequest, NotSent, true},
		{"EOF on reused conn from a replica refusing connections", PhaseAwait, true, ErrReplicaRestarting, NotSent, true},
		{"EOF before response on reused conn", PhaseAwait, true, io.ErrUnexpectedEOF, MaybeRunning, true},
		{"EOF before response on fresh conn", PhaseAwait, false, io.ErrUnexpectedEOF, MaybeRunning, true},
		{"no response in time", PhaseAwait, true, ErrTimeout, TimedOut, false},
		{"broken headers", PhaseResponse, false, io.ErrUnexpectedEOF, MaybeRunning, false},
		{"reset mid-body on reused conn", PhaseResponse, true, reset, MaybeRunning, false},
		{"stream cut", PhaseStream, true, io.ErrUnexpectedEOF, MidStream, false},
		{"client left while waiting", PhaseAwait, true, ErrClientGone, ClientGone, false},
		{"client left mid-stream", PhaseStream, false, ErrClientGone, ClientGone, false},
	}
	for _, tt := range tests {
		err := error(&SendError{Phase: tt.phase, Reused: tt.reused, Err: tt.err})
		got := Classify(tt.phase, tt.reused, err)
		if got != tt.want {
			t.Errorf("%s: Classify = %v, want %v", tt.name, got, tt.want)
		}
		if d := Demotes(got, tt.phase, tt.reused, err); d != tt.demote {
			t.Errorf("%s: Demotes = %v, want %v", tt.name, d, tt.demote)
		}
		if !errors.Is(err, tt.err) {
			t.Errorf("%s: SendError does not unwrap", tt.name)
		}
	}
}

func TestThrottle(t *testing.T) {
	var th Throttle
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at   time.Duration
		ok   bool
		held int64
	}{
		{0, true, 0},
		{10 * time.Millisecond, false, 0},
		{500 * time.Millisecond, false, 0},
		{1100 * time.Millisecond, true, 2},
		{1200 * time.Millisecond, false, 0},
		{3 * time.Second, true, 1},
	}
	for i, s := range steps {
		ok, held := th.Allow(t0.Add(s.at))
		if ok != s.ok || held != s.held {
			t.Errorf("step %d: Allow = %v %d, want %v %d", i, ok, held, s.ok, s.held)
		}
	}
}

func TestNewSet(t *testing.T) {
	s, err := NewSet([]string{"http://127.0.0.1:8001", " 127.0.0.1:8002 ", "http://gpu-host/vllm/"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, host, prefix string }{
		{"127.0.0.1:8001", "127.0.0.1:8001", ""},
		{"127.0.0.1:8002", "127.0.0.1:8002", ""},
		{"gpu-host:80", "gpu-host", "/vllm"},
	}
	for i, w := range want {
		r := s.Replicas[i]
		if r.Name != w.name || string(r.Host()) != w.host || string(r.Prefix()) != w.prefix || r.State() != Live {
			t.Errorf("replica %d: %s %s %s", i, r.Name, r.Host(), r.Prefix())
		}
	}
	for _, bad := range [][]string{nil, {"https://a:1"}, {"http://a:1", "a:1"}, {"http://"}} {
		if _, err := NewSet(bad, Config{}); err == nil {
			t.Errorf("NewSet(%q) did not fail", bad)
		}
	}
}
