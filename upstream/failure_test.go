package upstream

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestJudge is the verdict table: every phase and sign an exchange can
// fail with, fresh and reused connections, and what each means.
func TestJudge(t *testing.T) {
	reset := &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	refused := &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	eof := io.ErrUnexpectedEOF
	const no, fresh, other = Never, Fresh, Other
	tests := []struct {
		name   string
		phase  Phase
		sign   Sign
		reused bool
		err    error
		result Result
		resend Resend
		demote bool
		status int
	}{
		{"dial refused", PhaseDial, SignFailed, false, refused, NotSent, other, true, 503},
		{"dial timed out (black hole)", PhaseDial, SignTimeout, false, os.ErrDeadlineExceeded, NotSent, other, true, 503},
		{"write failed on a fresh connection", PhaseWrite, SignFailed, false, syscall.ECONNRESET, NotSent, other, true, 503},
		{"write failed on a reused connection (stale keep-alive)", PhaseWrite, SignFailed, true, syscall.EPIPE, NotSent, fresh, false, 503},
		{"write timed out on a reused connection (the replica does not read)", PhaseWrite, SignTimeout, true, os.ErrDeadlineExceeded, NotSent, other, true, 503},
		{"reset before the answer, fresh connection", PhaseAwait, SignReset, false, reset, NotSent, other, true, 503},
		{"reset before the answer, reused connection (stale keep-alive)", PhaseAwait, SignReset, true, reset, NotSent, fresh, false, 503},
		{"EPIPE pending behind the FIN, reused connection (stale keep-alive)", PhaseAwait, SignReset, true, syscall.EPIPE, NotSent, fresh, false, 503},
		{"FIN that did not acknowledge the request, reused (stale keep-alive)", PhaseAwait, SignUnacked, true, ErrClosedBeforeRequest, NotSent, fresh, false, 503},
		{"FIN that did not acknowledge the request, fresh", PhaseAwait, SignUnacked, false, ErrClosedBeforeRequest, NotSent, other, true, 503},
		{"end of stream that acknowledged the request, reused (killed after reading, or closed as it went out)", PhaseAwait, SignFailed, true, eof, MaybeRunning, no, false, 502},
		{"end of stream that acknowledged the request, fresh", PhaseAwait, SignFailed, false, eof, MaybeRunning, no, true, 502},
		{"no first byte in time", PhaseAwait, SignTimeout, true, ErrTimeout, TimedOut, no, false, 504},
		{"replica found hung while waiting", PhaseAwait, SignHung, false, ErrHung, TimedOut, no, false, 504},
		{"client left while waiting", PhaseAwait, SignClientGone, true, ErrClientGone, ClientGone, no, false, 499},
		{"broken head", PhaseHead, SignFailed, false, eof, MaybeRunning, no, false, 502},
		{"reset in the head (the replica had answered)", PhaseHead, SignReset, true, reset, MaybeRunning, no, false, 502},
		{"head that never finished", PhaseHead, SignTimeout, false, os.ErrDeadlineExceeded, TimedOut, no, false, 504},
		{"final answer after a 103 never came", PhaseHead, SignTimeout, false, ErrTimeout, TimedOut, no, false, 504},
		{"client left after a 103", PhaseHead, SignClientGone, false, ErrClientGone, ClientGone, no, false, 499},
		{"503 or 429 dropped for another replica", PhaseHead, SignRejected, true, errors.New("replica answered 503"), Rejected, other, false, 0},
		{"body cut before the client saw a byte", PhaseBody, SignFailed, true, eof, MaybeRunning, no, false, 502},
		{"body stalled", PhaseBody, SignTimeout, true, os.ErrDeadlineExceeded, TimedOut, no, false, 504},
		{"whole answer cut by the replica's close (JSON unfinished)", PhaseBody, SignCut, false, ErrCut, MaybeRunning, no, true, 502},
		{"stream cut", PhaseStream, SignFailed, true, eof, MidStream, no, false, 0},
		{"stream ended by close before its last event", PhaseStream, SignCut, false, ErrCut, MidStream, no, false, 0},
		{"stream stalled", PhaseStream, SignTimeout, true, ErrTimeout, MidStream, no, false, 0},
		{"replica found hung mid-stream", PhaseStream, SignHung, true, ErrHung, MidStream, no, false, 0},
		{"client left mid-stream", PhaseStream, SignClientGone, false, ErrClientGone, ClientGone, no, false, 499},
	}
	for _, tt := range tests {
		e := &Error{Phase: tt.phase, Sign: tt.sign, Reused: tt.reused, Err: tt.err}
		want := Verdict{Result: tt.result, Resend: tt.resend, Demote: tt.demote, Status: tt.status}
		if tt.sign == SignRejected {
			want.Skip = e.RetryAfter
		}
		if got := Judge(e, Attempt{Sends: 1, MaxSends: 2, Others: true}); got != want {
			t.Errorf("%s: Judge = %+v, want %+v", tt.name, got, want)
		}
		if !errors.Is(e, tt.err) {
			t.Errorf("%s: Error does not unwrap", tt.name)
		}
		if !strings.HasPrefix(e.Error(), tt.phase.String()+" (") {
			t.Errorf("%s: Error() = %q does not name its phase first", tt.name, e.Error())
		}
	}
}

// Judge weighs how far the request went: a request that could go to
// another replica goes only while a send is left and a replica can take
// it, and a stale keep-alive connection is retried fresh once.
func TestJudgeWeighsTheAttempt(t *testing.T) {
	refused := &Error{Phase: PhaseDial, Err: syscall.ECONNREFUSED}
	stale := &Error{Phase: PhaseAwait, Sign: SignReset, Reused: true, Err: syscall.ECONNRESET}
	rejected := &Error{Phase: PhaseHead, Sign: SignRejected, Reused: true, RetryAfter: 3 * time.Second, Err: errors.New("503")}
	tests := []struct {
		name string
		e    *Error
		a    Attempt
		want Verdict
	}{
		{"refused, a send left, another replica", refused, Attempt{Sends: 1, MaxSends: 2, Others: true},
			Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}},
		{"refused, out of sends", refused, Attempt{Sends: 2, MaxSends: 2, Others: true},
			Verdict{Result: NotSent, Resend: Never, Demote: true, Status: 503}},
		{"refused, no other replica", refused, Attempt{Sends: 1, MaxSends: 2},
			Verdict{Result: NotSent, Resend: Never, Demote: true, Status: 503}},
		{"stale keep-alive, first time", stale, Attempt{Sends: 1, MaxSends: 1},
			Verdict{Result: NotSent, Resend: Fresh, Status: 503}},
		{"reset again on the fresh connection", stale, Attempt{Sends: 1, MaxSends: 2, Fresh: true, Others: true},
			Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}},
		{"rejected, another replica", rejected, Attempt{Sends: 1, MaxSends: 2, Others: true},
			Verdict{Result: Rejected, Resend: Other, Skip: 3 * time.Second}},
		{"rejected, out of sends: its answer is relayed", rejected, Attempt{Sends: 2, MaxSends: 2, Others: true},
			Verdict{Result: Rejected, Resend: Never}},
	}
	for _, tt := range tests {
		if got := Judge(tt.e, tt.a); got != tt.want {
			t.Errorf("%s: Judge = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// The sign of an error is read from what the connection saw: a reset counts
// as evidence only before any response byte.
func TestFailSign(t *testing.T) {
	c := &Conn{r: &Replica{}}
	tests := []struct {
		phase Phase
		err   error
		want  Sign
	}{
		{PhaseAwait, &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, SignReset},
		{PhaseAwait, os.NewSyscallError("read", syscall.EPIPE), SignReset},
		{PhaseAwait, io.ErrUnexpectedEOF, SignFailed},
		{PhaseHead, os.NewSyscallError("read", syscall.ECONNRESET), SignFailed},
		{PhaseBody, os.ErrDeadlineExceeded, SignTimeout},
		{PhaseStream, io.ErrUnexpectedEOF, SignFailed},
	}
	for _, tt := range tests {
		e := c.fail(tt.phase, tt.err)
		if e.Sign != tt.want || e.Phase != tt.phase || !c.broken {
			t.Errorf("fail(%v, %v) = %v %v, want sign %v and a broken connection", tt.phase, tt.err, e.Phase, e.Sign, tt.want)
		}
	}
}

func TestRejectedError(t *testing.T) {
	for _, tt := range []struct {
		header string
		want   time.Duration
	}{{"", time.Second}, {"7", 7 * time.Second}, {"0", 0}, {"Wed, 21 Oct 2015 07:28:00 GMT", time.Second}, {"-3", time.Second}} {
		e := RejectedError(429, []byte(tt.header), false)
		if e.RetryAfter != tt.want || e.Sign != SignRejected || Judge(e, Attempt{Sends: 1, MaxSends: 2, Others: true}).Resend != Other {
			t.Errorf("Retry-After %q: %v %v", tt.header, e.RetryAfter, e.Sign)
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
	s, err := NewSet([]string{"http://127.0.0.1:8001", "127.0.0.1:8002", "http://gpu-host:8000/", "[::1]:8003", "HTTPS://gpu-host:8443"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, url string }{
		{"127.0.0.1:8001", "http://127.0.0.1:8001"},
		{"127.0.0.1:8002", "http://127.0.0.1:8002"},
		{"gpu-host:8000", "http://gpu-host:8000"},
		{"[::1]:8003", "http://[::1]:8003"},
		{"gpu-host:8443", "https://gpu-host:8443"},
	}
	for i, w := range want {
		r := s.Replica(i)
		if r.Name != w.name || string(r.Host()) != w.name || r.URL != w.url || r.State() != Live {
			t.Errorf("replica %d: %s %s %s", i, r.Name, r.Host(), r.URL)
		}
	}
	for _, tt := range []struct {
		urls []string
		want string
	}{
		{nil, "no upstream replicas"},
		{[]string{"ftp://a:1"}, `scheme "ftp" is not supported; use http:// or https://`},
		{[]string{"http://a:1", "https://a:1"}, `upstream "https://a:1" is the same replica as "http://a:1"`},
		{[]string{"http://a:1", "a:1"}, `upstream "a:1" is the same replica as "http://a:1"`},
		{[]string{"http://"}, "cannot parse"},
		{[]string{"http://127.0.0.1:8001/v1"}, `upstream "http://127.0.0.1:8001/v1" has a path (/v1)`},
		{[]string{"http://a:8001 http://a:8002"}, "contains a space: separate base URLs with commas"},
		{[]string{"127.0.0.1:99999"}, `port "99999" is not a number from 1 to 65535`},
		{[]string{"127.0.0.1:0"}, `port "0" is not a number`},
		{[]string{"127.0.0.1"}, `upstream "127.0.0.1" has no port`},
		{[]string{"http://gpu-host"}, "has no port"},
		{[]string{"http://a:1?x=1"}, "has a query"},
		{[]string{"http://u:p@a:1"}, "cannot parse"},
	} {
		_, err := NewSet(tt.urls, Config{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewSet(%q) = %v, want an error with %q", tt.urls, err, tt.want)
		}
	}
}
