package upstream

import (
	"errors"
	"strconv"
	"time"
)

// Phase is where an exchange with a replica stood when it failed.
type Phase uint8

const (
	// PhaseDial: no connection was made.
	PhaseDial Phase = iota
	// PhaseWrite: the request could not be written whole.
	PhaseWrite
	// PhaseAwait: the request was written; no response byte had come.
	PhaseAwait
	// PhaseHead: response bytes had come; the head was being read.
	PhaseHead
	// PhaseBody: the head was read; the body was being read whole, and
	// nothing of the answer had reached the client (a forwarded 103 is
	// not the answer).
	PhaseBody
	// PhaseStream: response bytes had reached the client.
	PhaseStream
)

var phaseNames = [...]string{"dial", "write", "await", "head", "body", "stream"}

func (p Phase) String() string { return phaseNames[p] }

// Sign is what was seen when an exchange failed: the evidence that the
// verdict is drawn from.
type Sign uint8

const (
	// SignFailed: an error, or end of stream, that proves nothing about
	// whether the replica read the request.
	SignFailed Sign = iota
	// SignReset: before any response byte, the replica's kernel reset the
	// connection (ECONNRESET, or EPIPE pending behind its FIN). A kernel
	// resets a socket closed with unread bytes in it, so the request was
	// not read.
	SignReset
	// SignUnacked: before any response byte, the replica's FIN did not
	// acknowledge the request's bytes: its socket closed before they came.
	SignUnacked
	// SignTimeout: nothing came from the replica in time.
	SignTimeout
	// SignHung: the replica was demoted as hung while the exchange waited.
	SignHung
	// SignClientGone: the client closed its connection.
	SignClientGone
	// SignRejected: the replica answered 503 or 429 and the answer was
	// dropped so that another replica can serve the request.
	SignRejected
	// SignCut: the answer's body ended when the replica closed its
	// connection, before the answer's own end: a JSON answer with its
	// value unfinished, or a stream without its API's last event. Framing
	// by close cannot tell a cut from an end; only the content can.
	SignCut
)

var signNames = [...]string{"failed", "reset", "unacked", "timeout", "hung", "client_gone", "rejected", "cut"}

func (s Sign) String() string { return signNames[s] }

// Error is the one error type of an exchange with a replica: where it
// failed, what was seen, and the underlying error.
type Error struct {
	Phase Phase
	Sign  Sign
	// Reused is true when the connection had served an earlier request.
	Reused bool
	// RetryAfter is how long a replica that rejected the request asked to
	// be left alone (SignRejected only).
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	s := e.Phase.String() + " (" + e.Sign.String()
	if e.Reused {
		s += ", reused connection"
	}
	s += ")"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Result is an exchange's outcome as the sends metric counts it.
type Result uint8

const (
	// NotSent: the replica cannot have the request.
	NotSent Result = iota
	// MaybeRunning: the replica may be running the request.
	MaybeRunning
	// TimedOut: the replica had the request and sent nothing in time, or
	// was found hung.
	TimedOut
	// MidStream: the response had reached the client; it is cut.
	MidStream
	// ClientGone: the client left; not the replica's fault.
	ClientGone
	// Rejected: the replica answered 503 or 429; another replica got the
	// request.
	Rejected
	// OK: the replica's answer was relayed whole.
	OK
)

// ResultNames are the result label values, in order.
var ResultNames = [...]string{"not_sent", "maybe_running", "timeout", "mid_stream", "client_gone", "rejected", "ok"}

func (r Result) String() string { return ResultNames[r] }

// Resend says where a failed request goes next.
type Resend uint8

const (
	// Never: the request is answered, not sent again: the replica may be
	// running it, the client is gone, or no other send is allowed.
	Never Resend = iota
	// Fresh: a keep-alive connection that the replica had closed; the same
	// replica gets the request on a new connection, once. Its other idle
	// connections are dropped.
	Fresh
	// Other: another replica gets the request.
	Other
)

// Attempt is what Judge weighs beside the error: how far the request has
// gone.
type Attempt struct {
	// Sends is how many replicas the request was sent to, the failed one
	// included; MaxSends bounds it.
	Sends, MaxSends int
	// Fresh is set when the failed send was already the one on a fresh
	// connection after a stale keep-alive one.
	Fresh bool
	// Others reports whether a replica that has not had the request could
	// take it: live, and serving its model.
	Others bool
}

// Elsewhere reports whether the request may go to another replica: a
// send is left, and a replica that has not had it could take it. A 503 or
// 429 whose request may go elsewhere is dropped unread; otherwise it is
// the client's answer.
func (a Attempt) Elsewhere() bool { return a.Sends < a.MaxSends && a.Others }

// Verdict is what a failed exchange means, and everything that follows
// from it.
type Verdict struct {
	// Result is the send's outcome as the sends metric counts it.
	Result Result
	Resend Resend
	// Demote takes the replica out of rotation.
	Demote bool
	// Skip leaves the replica out of new picks for this long: it asked,
	// with a 503 or 429 and its Retry-After, to be left alone.
	Skip time.Duration
	// Status is what the client gets when the request is not sent again
	// and nothing reached it yet: 502 or 504 (the replica may have run
	// it), 503 (no replica could take it), or 499 for a client that
	// left. 0 in PhaseStream, where the client's stream is cut instead.
	Status int
}

// Judge is the proxy's one rule for what a failed exchange means, and so
// for a second send: a request goes to a replica again only on positive
// evidence that the one before never took it in, and while a send is left
// and another replica can take it.
//
// The evidence, and its limits:
//   - A failed dial, or a write that did not complete, is NotSent: the
//     replica never had the whole body, and an OpenAI endpoint does
//     nothing with half a request.
//   - Before any response byte, a reset (SignReset) or a FIN that did not
//     acknowledge the request (SignUnacked) is NotSent: a kernel resets a
//     socket closed with unread bytes in it, and a FIN sent before our
//     bytes arrived cannot cover them. Both happen when a replica closes an
//     idle keep-alive connection just as a request goes out on it, or dies
//     before reading it. Limits: a replica that aborts a connection on
//     purpose (SO_LINGER 0) after reading a request would be sent it twice,
//     and no inference server does that; where TCP_INFO cannot be read
//     (not Linux), such a request gets a 502 where a retry was safe, the
//     conservative side.
//   - Anything else once the request was written is MaybeRunning (or
//     TimedOut): a 502 or 504, never a second send. An end of stream that
//     acknowledged the request proves nothing, even from a replica that
//     now refuses connections: a process killed after it read a request
//     looks just like that. Such doubtful cases are kept rare instead of
//     guessed: pooled connections are closed before the replica's own
//     keep-alive timeout closes them under a request (IdleTimeout).
//   - On a reused connection, NotSent means the replica had closed it
//     while idle: the replica is not blamed, and the request goes to it
//     again on a fresh connection (Fresh), once. On a new connection it
//     means the replica is failing: it is demoted, and another replica
//     gets the request (Other).
//   - A 503 or 429 (SignRejected) goes to another replica when one can
//     take it, its body dropped unread; the replica is skipped for its
//     Retry-After, not demoted. Otherwise the client gets that answer
//     (Status 0: the replica's own).
//     Never a 500 or 502: that request may have run.
//   - A whole answer that the replica's close cut short (SignCut in
//     PhaseBody) is a 502 and demotes the replica: it closed a
//     connection in the middle of an answer, as a crashing server does,
//     and its probes decide when it comes back. The same cut of a stream
//     is MidStream, as any other.
//   - Once any byte of the answer has reached the client, nothing is sent
//     again: the client's stream is cut so that it sees an error. Interim
//     answers (a forwarded 103) are not the answer: a 503 after one may
//     still go to another replica, whose answer the client then gets.
//   - A request that could go to another replica but may not (no send
//     left, or none can take it) gets a 503: it reached no replica.
//   - The reset evidence holds when the TCP peer is the replica's own
//     socket. A proxy between warmroute and the replica that passes an
//     upstream reset on as a reset of its own (an Envoy sidecar, some
//     HAProxy setups) would turn "read it and crashed" into a reset: put
//     no such hop between them.
//   - The client leaving is ClientGone in every phase, and blames nobody.
func Judge(e *Error, a Attempt) Verdict {
	v := judge(e, a.Fresh)
	if v.Resend == Other && !a.Elsewhere() {
		v.Resend, v.Skip = Never, 0
	}
	return v
}

// Result is e's outcome as the sends metric counts it, for a failure
// that leaves nothing to decide: a stream cut once the client had bytes.
func (e *Error) Result() Result { return judge(e, false).Result }

// judge is Judge before the count of sends and replicas is weighed.
func judge(e *Error, fresh bool) Verdict {
	switch {
	case e.Sign == SignClientGone:
		return Verdict{Result: ClientGone, Status: 499}
	case e.Phase == PhaseStream:
		return Verdict{Result: MidStream}
	case e.Sign == SignRejected:
		return Verdict{Result: Rejected, Resend: Other, Skip: e.RetryAfter}
	case e.Phase == PhaseDial, e.Phase == PhaseWrite && e.Sign == SignTimeout:
		// A dial that failed sent nothing. A write that timed out: the
		// replica is there but does not read, not a stale connection,
		// and it would stall again.
		return Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}
	case e.Phase == PhaseWrite || (e.Phase == PhaseAwait && (e.Sign == SignReset || e.Sign == SignUnacked)):
		if e.Reused && !fresh {
			return Verdict{Result: NotSent, Resend: Fresh, Status: 503}
		}
		return Verdict{Result: NotSent, Resend: Other, Demote: true, Status: 503}
	case e.Sign == SignTimeout || e.Sign == SignHung:
		return Verdict{Result: TimedOut, Status: 504}
	case e.Sign == SignCut:
		return Verdict{Result: MaybeRunning, Demote: true, Status: 502}
	case e.Phase == PhaseAwait && !e.Reused:
		// It dropped a new connection that it had a whole request on.
		return Verdict{Result: MaybeRunning, Demote: true, Status: 502}
	default:
		// A reused connection in PhaseAwait, or a head or body that
		// failed: the replica may have closed the connection as the
		// request went out, and one that died is found by the next dial,
		// so it is not demoted for this.
		return Verdict{Result: MaybeRunning, Status: 502}
	}
}

// Rejects reports whether an answer's status asks for the request to go
// elsewhere (503, 429), as Judge weighs it.
func Rejects(status int) bool { return status == 503 || status == 429 }

// ErrTimeout is the error of a wait past its timeout.
var ErrTimeout = errors.New("replica sent nothing within the timeout")

// ErrTooSlow is the error of a stream that sent fewer than StreamMinRate
// bytes a second for StreamIdleTimeout.
var ErrTooSlow = errors.New("replica sent less than the minimum rate for the stream idle timeout")

// ErrResponseTimeout is the error of an answer not ended within
// ResponseTimeout.
var ErrResponseTimeout = errors.New("replica's answer took longer than the response timeout")

// ErrHung is the error of a wait on a replica demoted as hung.
var ErrHung = errors.New("replica was demoted as hung while the request waited")

// ErrClientGone is the error of a wait that the client left.
var ErrClientGone = errors.New("client closed the connection")

// ErrCut is the error of an answer that ended by close before its own end
// (SignCut).
var ErrCut = errors.New("replica closed the connection before the answer's end")

// ErrClosedBeforeRequest is end of stream from a replica whose FIN did not
// acknowledge the request's bytes.
var ErrClosedBeforeRequest = errors.New("replica closed the connection before the request reached it")

// RejectedError returns the error of a 503 or 429 answer that is dropped so
// that another replica can serve the request. retryAfter is the answer's
// Retry-After header in seconds, or empty.
func RejectedError(status int, retryAfter []byte, reused bool) *Error {
	d := time.Second
	if n, err := strconv.Atoi(string(retryAfter)); err == nil && n >= 0 {
		d = time.Duration(n) * time.Second
	}
	return &Error{Phase: PhaseHead, Sign: SignRejected, Reused: reused, RetryAfter: d,
		Err: errors.New("replica answered " + strconv.Itoa(status))}
}
