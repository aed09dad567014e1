package upstream

import (
	"errors"
	"syscall"
)

// Phase is where a request to a replica stood when it failed.
type Phase uint8

const (
	// PhaseDial: no connection was made.
	PhaseDial Phase = iota
	// PhaseWrite: the request could not be written whole.
	PhaseWrite
	// PhaseAwait: the request was written; no response byte had come.
	PhaseAwait
	// PhaseResponse: response bytes had come, nothing reached the client.
	PhaseResponse
	// PhaseStream: response bytes had reached the client.
	PhaseStream
)

var phaseNames = [...]string{"dial", "write", "await", "response", "stream"}

func (p Phase) String() string { return phaseNames[p] }

// SendError is a failure to reach a replica, typed by where it happened.
type SendError struct {
	Phase  Phase
	Reused bool // the connection had served an earlier request
	Err    error
}

func (e *SendError) Error() string { return e.Phase.String() + ": " + errText(e.Err) }
func (e *SendError) Unwrap() error { return e.Err }

// Fault is what a failure means for the request, and doubles as the result
// label of the sends metric.
type Fault uint8

const (
	// NotSent: the replica cannot have the request; another may get it.
	NotSent Fault = iota
	// MaybeRunning: the replica may be running the request; no second send.
	MaybeRunning
	// TimedOut: the replica had the request and sent nothing in time.
	TimedOut
	// MidStream: the response had reached the client; it is cut.
	MidStream
	// ClientGone: the client left; not the replica's fault.
	ClientGone
	// OK is a send that completed; it is never returned by Classify.
	OK
)

// FaultNames are the label values of the faults, in order.
var FaultNames = [...]string{"not_sent", "maybe_running", "timeout", "mid_stream", "client_gone", "ok"}

func (f Fault) String() string { return FaultNames[f] }

// Classify decides what a failure at phase means. It is the proxy's one rule
// for a second send: only NotSent may be sent again, to another replica.
//
// The rule, and its limits:
//   - A failed dial, or a write that did not complete, is NotSent: the
//     replica never had the whole body, and an OpenAI endpoint does nothing
//     with half a request.
//   - A pooled connection that the replica closed while it sat idle is found
//     by Acquire's non-blocking peek before the write, and never counts as a
//     send at all.
//   - After the whole request was written, end of stream before any
//     response byte is MaybeRunning: the replica may have read the body
//     before it closed. Two signs say it cannot have: a reset (ECONNRESET,
//     or EPIPE left pending behind the replica's FIN), since a kernel resets
//     a connection closed with unread bytes in it; and a FIN that does not
//     acknowledge our request's bytes (TCP_INFO unacked > 0), since the
//     replica's socket closed before they arrived. Both happen when a
//     replica closes an idle keep-alive connection just as a request is
//     sent on it, or dies before reading it; both are NotSent. A third:
//     on a reused connection, a replica that now refuses new connections
//     has closed its listener, as a restarting process does before it
//     closes its idle connections; it closed this one as idle (it may have
//     read our bytes into a buffer, but it dropped them) and runs nothing of
//     ours. A fresh connection gets no such benefit of doubt. Limits: a
//     replica that aborts a connection on purpose (SO_LINGER 0) after
//     reading a request would be sent it twice, and no inference server
//     does that; where TCP_INFO cannot be read, such a request gets a 502
//     where a retry was safe, the conservative side.
//   - Once any response byte has come, nothing is sent again.
//   - The client leaving is ClientGone in every phase.
func Classify(phase Phase, reused bool, err error) Fault {
	switch {
	case errors.Is(err, ErrClientGone):
		return ClientGone
	case phase == PhaseDial || phase == PhaseWrite:
		return NotSent
	case phase == PhaseStream:
		return MidStream
	case errors.Is(err, ErrTimeout):
		return TimedOut
	case phase == PhaseAwait && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, ErrClosedBeforeRequest) || errors.Is(err, ErrReplicaRestarting)):
		return NotSent
	default:
		return MaybeRunning
	}
}

// Stale reports whether a NotSent failure was a pooled keep-alive connection
// that the replica had closed: the request may go to the same replica again
// on a fresh connection, and the replica is not to blame.
func Stale(f Fault, phase Phase, reused bool, err error) bool {
	return f == NotSent && reused && phase != PhaseDial && !errors.Is(err, ErrReplicaRestarting)
}

// Demotes reports whether a failure of this kind takes the replica out of
// rotation: it could not be reached, or it dropped a connection that it had
// a request on. A slow replica is not demoted, and a client leaving is
// nobody's fault. A keep-alive connection that the replica closed just as a
// request went out on it (found at the write or by the signs Classify reads)
// says nothing about the replica: the request goes elsewhere, and the next
// dial tells whether the replica is down, unless it already refuses
// connections (ErrReplicaRestarting).
func Demotes(f Fault, phase Phase, reused bool, err error) bool {
	switch f {
	case NotSent:
		return !reused || phase == PhaseDial || errors.Is(err, ErrReplicaRestarting)
	case MaybeRunning:
		return phase == PhaseAwait
	default:
		return false
	}
}
