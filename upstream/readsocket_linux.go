//go:build linux && !race

package upstream

import (
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// readSocket is one read of a socket that does not block (MSG_DONTWAIT,
// whatever the descriptor's flags), made directly: the runtime's poller
// is not involved, as the socket is read inside its RawConn.Read. An end
// of stream is io.EOF, as from net.Conn. The race detector does not see
// this read; readsocket_race_linux.go is the one it sees.
func readSocket(fd uintptr, p []byte) (int, error) {
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

// writevSocket is one non-blocking writev(2) of both buffers of iov (the
// second one if it is not empty), made directly. A socket buffer that is
// full (EAGAIN) is a write of 0 bytes, not an error. The race detector
// does not see this write either; readsocket_race_linux.go's is seen.
func writevSocket(fd uintptr, iov *[2]unix.Iovec) (int, error) {
	cnt := uintptr(len(iov))
	if iov[1].Len == 0 {
		cnt = 1
	}
	for {
		n, _, errno := syscall.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), cnt)
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
