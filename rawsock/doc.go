// Package rawsock makes a TCP connection's reads and writes as raw system
// calls, outside the runtime's system-call bookkeeping.
//
// net.Conn's Read and Write enter each read(2) and write(2) through
// entersyscall and exitsyscall, so that the scheduler may hand the
// goroutine's P to another thread should the call block. On a socket that
// does not block (net makes every socket so) the call cannot block, and
// the bookkeeping is pure cost: several hundred instructions a call, and
// worse at low load, where every Ps sat idle between requests and the
// runtime's monitor thread (sysmon) slept: the first system call after
// the wait wakes it, and it runs and sleeps again, a futex wake and four
// context switches a request (scripts/peers.sh, chat at one connection).
// A Conn reads and writes inside its RawConn's Read and Write instead,
// which wait on the runtime's poller, with the connection's deadlines,
// exactly as net.Conn's do.
//
// Large calls are raw too, in pieces of at most MaxCall bytes. A
// bookkept call wakes sysmon at low load, which then polls every 20 us
// for a millisecond or more: with a 360 KB request body (an agent's
// context of 90k tokens) at one connection, sysmon's polling was a fifth
// of the proxy's CPU samples (perf, peers-issue13.md, session 12). What
// the bookkeeping buys, a P handed on while a long call runs, a socket
// that does not block needs only against a call that copies for long,
// and MaxCall keeps each call short. Under the race detector every call
// is bookkept (syscall.Read and Write), which tells the detector of the
// bytes each one touches.
package rawsock
