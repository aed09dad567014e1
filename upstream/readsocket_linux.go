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
