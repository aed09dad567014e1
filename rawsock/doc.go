// Package rawsock makes a TCP connection's small reads and writes as raw
// system calls, outside the runtime's system-call bookkeeping.
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
// Calls over rawMax bytes go through the bookkept system call still: a
// copy of hundreds of kilobytes through the loopback may run long enough
// that the P is worth handing on. Under the race detector every call is
// bookkept (syscall.Read and Write), which tells the detector of the
// bytes each one touches.
package rawsock
