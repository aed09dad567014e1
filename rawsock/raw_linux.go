//go:build linux && !race

package rawsock

import (
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const supported = true

// Recv is one read(2) of a socket that does not block (MSG_DONTWAIT,
// whatever the descriptor's flags), made directly: the runtime neither
// books it nor, unless the caller is inside its RawConn.Read, has its
// poller told of it. An end of stream is io.EOF; an empty socket is
// syscall.EAGAIN. The race detector does not see this read;
// raw_race_linux.go's is the one it sees.
func Recv(fd uintptr, p []byte) (int, error) {
	for {
		n, _, errno := syscall.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)),
			unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EINTR:
			continue
		case errno != 0:
			return 0, errno
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return int(n), nil
	}
}

// Peek is Recv of one byte with MSG_PEEK: it consumes nothing. It returns
// 1 when a byte is there, 0 at the end of stream, and syscall.EAGAIN when
// the socket has nothing yet.
func Peek(fd uintptr, b *[1]byte) (int, error) {
	n, _, errno := syscall.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// send is Recv's write(2): a full socket buffer is syscall.EAGAIN.
func send(fd uintptr, p []byte) (int, error) {
	for {
		n, _, errno := syscall.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)),
			unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, errno
	}
}

// Writev is one write of both buffers of iov (the second one if it is not
// empty), made directly: sendmsg(2) with MSG_DONTWAIT, so that it cannot
// block whatever the descriptor's flags. A socket buffer that is full
// (EAGAIN) is a write of 0 bytes, not an error. The race detector does not
// see this write either; raw_race_linux.go's is seen.
func Writev(fd uintptr, iov *[2]unix.Iovec) (int, error) {
	var msg unix.Msghdr
	msg.Iov = &iov[0]
	msg.SetIovlen(len(iov))
	if iov[1].Len == 0 {
		msg.SetIovlen(1)
	}
	for {
		n, _, errno := syscall.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, errno
	}
}
