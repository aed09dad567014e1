//go:build linux && race

package rawsock

import (
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const supported = true

// Recv is raw_linux.go's read through syscall.Read, which tells the race
// detector of the bytes it writes into p and of the ordering it brings
// from the other end: with the raw read, -race would report races that are
// not there, and miss a read buffer used after it went back to a pool. The
// socket does not block, as net made it.
func Recv(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// Peek is raw_linux.go's, through syscall.Recvfrom.
func Peek(fd uintptr, b *[1]byte) (int, error) {
	n, _, err := syscall.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// send is raw_linux.go's write through syscall.Write, seen by the race
// detector.
func send(fd uintptr, p []byte) (int, error) {
	for {
		n, err := syscall.Write(int(fd), p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}

// Writev is raw_linux.go's writev as syscall.Write calls, one a buffer:
// they tell the race detector of the bytes they read and of the ordering
// they bring to the other end (a replica served by a test itself).
func Writev(fd uintptr, iov *[2]unix.Iovec) (int, error) {
	var n int
	for i := range iov {
		p := unsafe.Slice(iov[i].Base, iov[i].Len)
		for len(p) > 0 {
			m, err := syscall.Write(int(fd), p)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return n, nil
			case err != nil:
				return 0, err
			}
			n += m
			if m < len(p) {
				return n, nil
			}
			p = p[m:]
		}
	}
	return n, nil
}
